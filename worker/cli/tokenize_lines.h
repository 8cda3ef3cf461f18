/* The JSON lines of `llmq tokenize`: every input line answered by one output line, in input order.
 * The lines are cut into batches that a few threads answer at once; a batch's answers are written
 * (and flushed) as soon as every batch before it is written, so a caller that sends one line and
 * waits gets its answer. */
#pragma once
#include <stdbool.h>
#include <stdio.h>

#include "engine/tokenizer.h"

struct tokenize_lines_opts {
    const struct tok *tok;
    const char *tpl_dir;  /* the folder of tokenizer_config.json (the chat template's) */
    const char *tpl_file; /* --chat-template, or NULL */
    bool skip_special;    /* leave special tokens out when decoding ids */
    int threads;          /* threads answering lines (at least 1) */
};

/* Answers the lines read from the file descriptor in_fd on out (cmd_tokenize's usage text says
 * how). Returns the exit status: 0, or 1 when any line got an error. */
int tokenize_lines(int in_fd, FILE *out, const struct tokenize_lines_opts *o);
