/* An intrusive doubly-linked list: the item embeds a struct list_node, the list keeps both ends and
 * its length, and nothing is allocated. The ends are NULL (no sentinel), so a walk reads
 *
 *     for (struct list_node *n = l->head; n; n = n->next) { struct job *j = LIST_ITEM(n, struct job, link);
 * ... }
 *
 * and removing the item at hand is safe when the walk took n->next first. An item is in at most
 * one list through one node; a node in no list has prev and next NULL. */
#pragma once
#include <stddef.h>

struct list_node {
    struct list_node *prev, *next;
};

struct list {
    struct list_node *head, *tail;
    int n; /* nodes in the list */
};

/* The item that embeds node as its member `member`; NULL for a NULL node. */
#define LIST_ITEM(node, type, member) ((type *)list_item_((node), offsetof(type, member)))
static inline void *list_item_(struct list_node *node, size_t off)
{
    return node ? (char *)node - off : NULL;
}

void list_push_back(struct list *l, struct list_node *x);
void list_push_front(struct list *l, struct list_node *x);
/* Inserts x after at, which is in l; at NULL inserts x at the front. */
void list_insert_after(struct list *l, struct list_node *at, struct list_node *x);
/* Unlinks x, which is in l, and clears its links. */
void list_remove(struct list *l, struct list_node *x);
