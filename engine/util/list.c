/* See list.h. */
#include "engine/util/list.h"

void list_insert_after(struct list *l, struct list_node *at, struct list_node *x)
{
    x->prev = at;
    x->next = at ? at->next : l->head;
    if (x->next)
        x->next->prev = x;
    else
        l->tail = x;
    if (at)
        at->next = x;
    else
        l->head = x;
    l->n++;
}

void list_push_back(struct list *l, struct list_node *x)
{
    list_insert_after(l, l->tail, x);
}

void list_push_front(struct list *l, struct list_node *x)
{
    list_insert_after(l, NULL, x);
}

void list_remove(struct list *l, struct list_node *x)
{
    if (x->prev)
        x->prev->next = x->next;
    else
        l->head = x->next;
    if (x->next)
        x->next->prev = x->prev;
    else
        l->tail = x->prev;
    x->prev = x->next = NULL;
    l->n--;
}
