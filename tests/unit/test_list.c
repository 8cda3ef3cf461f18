/* engine/util/list: pushes at both ends, insertion after a node and at the front, removal at the
 * ends and in the middle; after each, the list read forwards and backwards against the expected
 * order, its length, and the links of removed nodes cleared. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/util/list.h"

struct item {
    int id;
    struct list_node link;
};

/* l forwards equals want[0..n), backwards too, and l->n is n. */
static void expect(const struct list *l, const int *want, int n)
{
    assert_int_equal(l->n, n);
    int i = 0;
    struct list_node *prev = NULL;
    for (struct list_node *x = l->head; x; prev = x, x = x->next, i++) {
        assert_true(i < n);
        assert_int_equal(LIST_ITEM(x, struct item, link)->id, want[i]);
        assert_ptr_equal(x->prev, prev); /* the back link agrees with the forward walk */
    }
    assert_int_equal(i, n);
    assert_ptr_equal(l->tail, prev);
    for (struct list_node *x = l->tail; x; x = x->prev)
        assert_int_equal(LIST_ITEM(x, struct item, link)->id, want[--i]);
    assert_int_equal(i, 0);
    if (!n)
        assert_true(!l->head && !l->tail);
}

static void test_list(void **state)
{
    (void)state;
    struct item it[6];
    for (int i = 0; i < 6; i++)
        it[i] = (struct item){.id = i};
    struct list l = {0};
    expect(&l, NULL, 0);
    assert_null(LIST_ITEM(l.head, struct item, link));

    list_push_back(&l, &it[1].link);
    list_push_back(&l, &it[2].link);
    list_push_front(&l, &it[0].link);
    expect(&l, (int[]){0, 1, 2}, 3);
    list_insert_after(&l, &it[2].link, &it[3].link); /* after the tail: the new tail */
    list_insert_after(&l, &it[0].link, &it[4].link); /* in the middle */
    list_insert_after(&l, NULL, &it[5].link);        /* NULL: the front */
    expect(&l, (int[]){5, 0, 4, 1, 2, 3}, 6);

    list_remove(&l, &it[4].link); /* middle */
    assert_null(it[4].link.prev);
    assert_null(it[4].link.next);
    list_remove(&l, &it[5].link); /* head */
    list_remove(&l, &it[3].link); /* tail */
    expect(&l, (int[]){0, 1, 2}, 3);

    /* a walk that removes the node at hand, having taken next first */
    for (struct list_node *x = l.head, *next; x; x = next) {
        next = x->next;
        if (LIST_ITEM(x, struct item, link)->id != 1)
            list_remove(&l, x);
    }
    expect(&l, (int[]){1}, 1);
    list_remove(&l, &it[1].link);
    expect(&l, NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_list)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
