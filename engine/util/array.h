/* Growable arrays: the one rule by which every array that grows as items arrive gets its room.
 * The capacity doubles, so n appends cost O(n) copying in all. The array is any T *; a function
 * that grows one takes the address of the pointer (a T **, passed as void *). */
#pragma once
#include <stddef.h>

/* The capacity for need elements: cap when it holds them already, else the first of cap * 2,
 * cap * 4, ... (from min_cap when cap is 0) that does. SIZE_MAX when doubling would overflow. */
size_t array_grown_cap(size_t cap, size_t need, size_t min_cap);

/* Reallocates the array *arrp to n elements of elem bytes. Returns 0, or -1 when out of memory or
 * when n * elem overflows; then *arrp is unchanged and still valid. */
int array_resize(void *arrp, size_t n, size_t elem);

/* Makes the array *arrp, with room for *cap elements of elem bytes, hold at least need:
 * array_grown_cap then array_resize, and *cap updated. Returns 0 (also when it had room), or -1
 * when out of memory; then *arrp and *cap are unchanged. */
int array_reserve(void *arrp, size_t *cap, size_t need, size_t elem, size_t min_cap);
