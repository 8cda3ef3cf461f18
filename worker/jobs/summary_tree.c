/* The shape of a map-reduce summary tree: groups of a level and the depth (summary_tree.h). */
#include "worker/jobs/summary_tree.h"

int summary_groups(const int *lens, int n, int sep, int budget, int *ends)
{
    if (n < 1 || sep < 0 || !lens || !ends)
        return -1;
    for (int i = 0; i < n; i++) {
        if (lens[i] < 0 || lens[i] > budget)
            return -1;
        if (i + 1 < n && (long long)lens[i] + sep + lens[i + 1] > budget)
            return -1;
    }
    int g = 0;
    for (int i = 0; i < n;) {
        long long sum = lens[i];
        int j = i + 1;
        while (j < n && sum + sep + lens[j] <= budget)
            sum += sep + lens[j++];
        /* one alone can only be the last (every neighbour pair fits): it takes the previous group's
         * last member when that group keeps two */
        if (j - i == 1 && g > 0 && ends[g - 1] - (g > 1 ? ends[g - 2] : 0) >= 3)
            ends[g - 1]--;
        ends[g++] = j;
        i = j;
    }
    return g;
}

int summary_level_width(int n_chunks, int max_len, int sep, int budget, int level)
{
    if (n_chunks < 1 || max_len < 0 || sep < 0 || level < 0)
        return -1;
    if (n_chunks == 1)
        return level == 0 ? 1 : 0;
    if (2LL * max_len + sep > budget)
        return -1;
    /* k max_len-long inputs fit one group: k * max_len + (k - 1) * sep <= budget */
    long long n = n_chunks,
              k = max_len + sep > 0 ? ((long long)budget + sep) / ((long long)max_len + sep) : n;
    for (int l = 0; l < level; l++) {
        if (n == 1)
            return 0;
        n = (n + k - 1) / k;
    }
    return (int)n;
}

int summary_depth(int n_chunks, int max_len, int sep, int budget)
{
    if (summary_level_width(n_chunks, max_len, sep, budget, 0) < 0)
        return -1;
    int depth = 1;
    while (summary_level_width(n_chunks, max_len, sep, budget, depth - 1) > 1)
        depth++;
    return depth;
}
