#include "engine/util/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void release(struct atomic_file *a)
{
    free(a->path);
    free(a->tmp);
    a->f = NULL, a->path = a->tmp = NULL;
}

int atomic_file_open(struct atomic_file *a, const char *path, char *msg, size_t msglen)
{
    *a = (struct atomic_file){0};
    size_t n = strlen(path) + 32;
    a->path = strdup(path);
    a->tmp = malloc(n);
    if (!a->path || !a->tmp) {
        snprintf(msg, msglen, "%s: out of memory", path);
        release(a);
        return -1;
    }
    snprintf(a->tmp, n, "%s.tmp-%ld", path, (long)getpid());
    if (!(a->f = fopen(a->tmp, "w"))) {
        snprintf(msg, msglen, "cannot write %s: %s", a->tmp, strerror(errno));
        release(a);
        return -1;
    }
    return 0;
}

/* fsync of the folder that holds path, so that the rename itself survives a crash; errors ignored */
static void sync_folder(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(copy);
}

int atomic_file_commit(struct atomic_file *a, char *msg, size_t msglen)
{
    int rc = 0;
    errno = 0; /* a write error that ferror reports may have left no errno: then EIO, not a stale one */
    if (fflush(a->f) || ferror(a->f) || fsync(fileno(a->f))) {
        snprintf(msg, msglen, "writing %s: %s", a->tmp, strerror(errno ? errno : EIO));
        rc = -1;
    }
    if (fclose(a->f) && rc == 0) {
        snprintf(msg, msglen, "writing %s: %s", a->tmp, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && rename(a->tmp, a->path)) {
        snprintf(msg, msglen, "cannot rename %s to %s: %s", a->tmp, a->path, strerror(errno));
        rc = -1;
    }
    if (rc)
        unlink(a->tmp);
    else
        sync_folder(a->path);
    release(a);
    return rc;
}

void atomic_file_abort(struct atomic_file *a)
{
    if (a->f) {
        fclose(a->f);
        unlink(a->tmp);
    }
    release(a);
}
