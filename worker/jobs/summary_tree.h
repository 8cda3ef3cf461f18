/* The shape of a map-reduce summary tree (docs/JOBS.md): which summaries of one level are combined
 * into one request of the next, and how many levels a document takes. Pure: these functions read
 * only their arguments, so the worker that runs a tree and `llmq bench --workload mapreduce` that
 * measures one plan it the same way.
 *
 * A level's inputs are combined into consecutive groups, order kept; a group's prompt holds its
 * members' tokens with `sep` tokens between two neighbours, and that must fit `budget` tokens (the
 * context left once the reduce template and the output are taken off). */
#pragma once

/* Groups the consecutive inputs lens[0..n) (tokens each, >= 0) into groups whose members' tokens
 * plus sep tokens between two neighbours sum to at most budget, greedily from the left, order kept.
 * Writes each group's end index (exclusive) into ends[0..return), so group g is
 * [g ? ends[g - 1] : 0, ends[g]); ends must hold n entries. When n >= 2 every group but the last
 * holds at least 2 inputs, and so does the last unless its neighbour group holds exactly 2 that
 * cannot take a third (then it holds 1): so a level of n >= 2 inputs always gives fewer groups than
 * inputs. A last group of 1 takes the previous group's last member when that group keeps 2.
 * Returns the number of groups (1 when n == 1), or -1 when some input is longer than budget, two
 * neighbours do not fit together (lens[i] + sep + lens[i + 1] > budget), n < 1, sep < 0 or a length
 * is negative. */
int summary_groups(const int *lens, int n, int sep, int budget, int *ends);

/* The number of levels (the map level included) of the tree for n_chunks chunks when every summary
 * has max_len tokens: 1 when n_chunks == 1 (the one map summary is the answer), else 1 + the reduce
 * levels that summary_groups gives on max_len-long inputs until one is left. With summaries of at
 * most max_len tokens a tree is never deeper than this (a group of summary_groups holds at least
 * as many inputs as it would of max_len-long ones). -1 when it cannot converge (two max_len
 * summaries do not fit budget) or n_chunks < 1, max_len < 0 or sep < 0. */
int summary_depth(int n_chunks, int max_len, int sep, int budget);

/* The number of requests of reduce level `level` (1 = the first reduce level) for n_chunks chunks
 * with max_len-long summaries, as summary_depth counts them: n_chunks for level 0, 0 at and past
 * the depth, -1 when summary_depth is -1. An upper bound of a real tree's level with shorter
 * summaries. */
int summary_level_width(int n_chunks, int max_len, int sep, int budget, int level);
