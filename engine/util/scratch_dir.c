#include "engine/util/scratch_dir.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int scratch_dir_make(const char *parent, const char *name, char *dir, size_t len)
{
    const int n = snprintf(dir, len, "%s/llmq-%s-XXXXXX", parent && *parent ? parent : "/tmp", name);
    if (n < 0 || (size_t)n >= len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(dir) ? 0 : -1;
}

void scratch_dir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4096 + 512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%.4000s/%.255s", dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(dir);
}
