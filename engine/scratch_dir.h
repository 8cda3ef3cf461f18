/* Scratch folders: what a command or a test makes with mkdtemp and fills with a few files. */
#pragma once

/* Removes the files directly in dir (one level: a scratch folder has no subfolders), then dir.
 * Best effort: what cannot be removed stays, silently. */
void scratch_dir_remove(const char *dir);
