/* Scratch folders: what a command or a test makes with mkdtemp and fills with a few files. */
#pragma once
#include <stddef.h>

/* Makes a new folder <parent>/llmq-<name>-XXXXXX (/tmp when parent is NULL or empty) with mkdtemp and
 * writes its path into dir (len bytes). Returns 0, or -1 with errno set (dir then holds the template).
 * The parent is the caller's: a command or a test passes $TMPDIR, as users expect of a temporary
 * folder; this layer reads no environment. */
int scratch_dir_make(const char *parent, const char *name, char *dir, size_t len);

/* Removes the files directly in dir (one level: a scratch folder has no subfolders), then dir.
 * Best effort: what cannot be removed stays, silently. */
void scratch_dir_remove(const char *dir);
