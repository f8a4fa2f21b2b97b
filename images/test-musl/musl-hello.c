/* A dynamically linked musl program for box-test-musl: it runs only where the
 * musl loader and libc are, and says which libc it was built against. */
#include <stdio.h>

int main(void) {
#ifdef __GLIBC__
    puts("musl-hello: built against glibc, not musl");
    return 1;
#else
    puts("musl-hello: hello from musl");
    return 0;
#endif
}
