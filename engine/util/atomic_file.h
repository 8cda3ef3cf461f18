/* Files replaced whole: written under a temporary name beside the target, made durable, then renamed
 * over it, so a reader (or a restart after a crash) sees the old file or the new one, never half. */
#pragma once
#include <stddef.h>
#include <stdio.h>

struct atomic_file {
    FILE *f;    /* write here between open and commit/abort */
    char *path; /* the target */
    char *tmp;  /* <path>.tmp-<pid>, in the same folder so that rename stays on one file system */
};

/* Creates the temporary file for path. Returns 0, or -1 with msg (naming the file) and nothing made. */
int atomic_file_open(struct atomic_file *a, const char *path, char *msg, size_t msglen);

/* Flushes, fsyncs and closes the temporary file, renames it to the target and fsyncs the folder
 * (best effort: some file systems refuse it). Returns 0, or -1 with msg; on failure the temporary
 * file is removed and the target is as it was. Frees a either way. */
int atomic_file_commit(struct atomic_file *a, char *msg, size_t msglen);

/* Closes and removes the temporary file; the target is untouched. Frees a. No-op on a zeroed a. */
void atomic_file_abort(struct atomic_file *a);
