/* The think block of reasoning models (Qwen3, DeepSeek-R1 and its distills): which generated
 * tokens are reasoning and which are the answer, and the close that a thinking budget forces.
 *
 * A model thinks when its tokenizer has "<think>" and "</think>" as added tokens (one id each).
 * A sequence's output starts in reasoning when its prompt ends inside an open think block (the last
 * "<think>" of the prompt comes after its last "</think>", as DeepSeek-R1's generation prompt
 * "<think>\n" does); otherwise when the first output token is "<think>" (Qwen3 thinking); otherwise
 * it has no reasoning. Reasoning ends at the first "</think>"; what follows is the answer. The tags
 * themselves belong to neither text. A block that never closes makes the whole output reasoning.
 *
 * The budget counts the tokens inside the block (tags excluded). When it is reached and the block is
 * still open, the next tokens are forced: those of "\n</think>\n\n", or of "</think>\n\n" when the
 * sequence's last token already ends with a newline; then sampling resumes for the answer.
 *
 * Plain data, no allocation: the engine keeps one think_vocab per engine and one think_state per
 * sequence, and drives them token by token (engine/engine.c). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

struct tok;

#define THINK_MAX_CLOSE 8 /* most tokens of a forced close */

struct think_vocab {
    int32_t open, close;               /* the tag ids; -1 when the model does not think */
    int32_t close_nl[THINK_MAX_CLOSE]; /* "\n</think>\n\n" encoded */
    int n_close_nl;
    int32_t close_bare[THINK_MAX_CLOSE]; /* "</think>\n\n" encoded */
    int n_close_bare;
};

/* Fills v from tok: the tag ids when both are added tokens and both closes encode to at most
 * THINK_MAX_CLOSE ids that contain the close tag; otherwise v says the model does not think
 * (think_vocab_ok false). Never fails. */
void think_vocab_init(struct think_vocab *v, const struct tok *tok);
/* A vocabulary where nothing thinks. */
void think_vocab_none(struct think_vocab *v);
/* Whether the model has the think tags (the split and thinking budgets apply). */
bool think_vocab_ok(const struct think_vocab *v);

enum think_phase {
    THINK_NONE,  /* no reasoning: every token is answer */
    THINK_MAYBE, /* no token yet; a first "<think>" opens a block */
    THINK_IN,    /* inside the block: tokens are reasoning */
    THINK_AFTER, /* the block closed: tokens are answer */
};

/* Where one output token goes. */
enum think_route {
    THINK_ANSWER,    /* its text is answer */
    THINK_REASONING, /* its text is reasoning */
    THINK_OPEN,      /* the opening tag: no text */
    THINK_CLOSE,     /* the closing tag: no text; the answer follows */
};

struct think_state {
    enum think_phase phase;
    int budget;           /* tokens inside the block before the close is forced; -1 = no budget */
    int n_inside;         /* output tokens inside the block, tags excluded */
    int n_tokens;         /* output tokens of the block, tags included (what usage calls reasoning_tokens) */
    bool seen;            /* the output has a think block (it started in one or opened one) */
    const int32_t *force; /* the close being forced (points into the think_vocab), or NULL */
    int n_force, i_force;
};

/* A sequence's state before its first output token: prompt[0, n_prompt) decides whether it starts
 * in reasoning. budget < 0 = none. With a vocabulary that does not think, the phase is THINK_NONE. */
void think_start(struct think_state *s, const struct think_vocab *v, const int32_t *prompt, int n_prompt,
                 int budget);

/* Whether the next token must be forced (a close under way, or the budget reached inside an open
 * block). When it is and no close is under way, think_forced needs to know how the text ends. */
bool think_forcing(const struct think_state *s);
/* The id that replaces the next sampled token, or -1 when sampling decides. last_nl: the sequence's
 * last token (prompt or output) ends with a newline; read only when a close starts. */
int32_t think_forced(struct think_state *s, const struct think_vocab *v, bool last_nl);

/* Takes the next output token (sampled or forced) and says where it goes, moving the phase on. */
enum think_route think_push(struct think_state *s, const struct think_vocab *v, int32_t id);
