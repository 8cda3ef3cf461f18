/* UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits, in the 36-character text form,
 * e.g. "01932c07-a4b1-7c3e-9f2a-3b5e8d0c1f47". Ids made later sort after earlier ones (to the
 * millisecond). Job ids given to jobs without one are these. */
#pragma once

#define UUID_TEXT_LEN 36

/* Writes a new UUIDv7 and its terminating NUL into out. Thread-safe. */
void uuid7(char out[UUID_TEXT_LEN + 1]);
