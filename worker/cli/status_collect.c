/* See status_collect.h. */
#include "worker/cli/status_collect.h"

#include <jansson.h>
#include <string.h>

int status_collect_read(struct rq *q, struct status_collect *sc)
{
    memset(sc, 0, sizeof *sc);
    for (int s = 0; s < RQ_RS_N; s++)
        if (rq_rstream_info(q, s, &sc->s[s].len, &sc->s[s].dropped, sc->s[s].g, STATUS_COLLECT_GROUPS,
                            &sc->s[s].ngroups))
            return -1;
    return 0;
}

void status_collect_print(FILE *f, const struct status_collect *sc)
{
    bool any = false;
    for (int s = 0; s < RQ_RS_N; s++)
        any = any || sc->s[s].len || sc->s[s].dropped || sc->s[s].ngroups;
    if (!any)
        return;
    fprintf(f, "\nresult streams:\n");
    for (int s = 0; s < RQ_RS_N; s++) {
        fprintf(f, "  %-8s length %lld   dropped %lld   groups %d%s\n", rq_rstream_name(s),
                (long long)sc->s[s].len, (long long)sc->s[s].dropped, sc->s[s].ngroups,
                sc->s[s].ngroups ? "" : " (no collector has run: nothing is trimmed but by the cap)");
        for (int i = 0; i < sc->s[s].ngroups && i < STATUS_COLLECT_GROUPS; i++) {
            const struct rq_group_info *g = &sc->s[s].g[i];
            char lag[32];
            if (g->lag >= 0)
                snprintf(lag, sizeof lag, "%lld", (long long)g->lag);
            else
                snprintf(lag, sizeof lag, "?");
            fprintf(f,
                    "    group %-16s behind %s (not read)   pending %lld (read, not acknowledged)   "
                    "consumers %lld\n",
                    g->name, lag, (long long)g->pending, (long long)g->consumers);
        }
    }
}

json_t *status_collect_json(const struct status_collect *sc)
{
    json_t *o = json_object();
    for (int s = 0; s < RQ_RS_N; s++) {
        json_t *gs = json_array();
        for (int i = 0; i < sc->s[s].ngroups && i < STATUS_COLLECT_GROUPS; i++) {
            const struct rq_group_info *g = &sc->s[s].g[i];
            json_t *x =
                json_pack("{s:s, s:I, s:I, s:s}", "name", g->name, "consumers", (json_int_t)g->consumers,
                          "pending", (json_int_t)g->pending, "last_delivered", g->last_id);
            json_object_set_new(x, "lag", g->lag >= 0 ? json_integer(g->lag) : json_null());
            json_array_append_new(gs, x);
        }
        json_object_set_new(o, rq_rstream_name(s),
                            json_pack("{s:I, s:I, s:o}", "length", (json_int_t)sc->s[s].len, "dropped",
                                      (json_int_t)sc->s[s].dropped, "groups", gs));
    }
    return o;
}
