/* Scratch folders: what a command or a test makes with mkdtemp and fills with a few files. */
#pragma once
#include <stddef.h>

/* Makes a new folder $TMPDIR/llmq-<name>-XXXXXX (/tmp where TMPDIR is unset or empty) with mkdtemp and
 * writes its path into dir (len bytes). Returns 0, or -1 with errno set (dir then holds the template). */
int scratch_dir_make(const char *name, char *dir, size_t len);

/* Removes the files directly in dir (one level: a scratch folder has no subfolders), then dir.
 * Best effort: what cannot be removed stays, silently. */
void scratch_dir_remove(const char *dir);
