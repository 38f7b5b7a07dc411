/* resolve: resolves names through glibc's getaddrinfo, exactly as the glibc-dynamic Rust
 * binaries do (std::net::ToSocketAddrs, tokio::net::lookup_host), and optionally connects.
 *
 *   resolve NAME...               print "NAME ADDRESS" for each name; exit 1 if one fails
 *   resolve --connect PORT NAME   also open a TCP connection to the first address
 *
 * The e2e image builder ships it with the libraries `ldd` lists, like the project's binaries,
 * so a pod running it proves that name resolution works in those images. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  const char *port = NULL;
  int i = 1;
  if (argc > 2 && strcmp(argv[1], "--connect") == 0) {
    port = argv[2];
    i = 3;
  }
  if (i >= argc) {
    fprintf(stderr, "usage: resolve [--connect PORT] NAME...\n");
    return 2;
  }
  int rc = 0;
  for (; i < argc; i++) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int err = getaddrinfo(argv[i], port, &hints, &res);
    if (err != 0) {
      fprintf(stderr, "resolve: %s: %s\n", argv[i], gai_strerror(err));
      rc = 1;
      continue;
    }
    char buf[INET6_ADDRSTRLEN] = "";
    void *addr = res->ai_family == AF_INET
                     ? (void *)&((struct sockaddr_in *)res->ai_addr)->sin_addr
                     : (void *)&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr;
    inet_ntop(res->ai_family, addr, buf, sizeof buf);
    printf("%s %s\n", argv[i], buf);
    if (port) {
      int fd = socket(res->ai_family, SOCK_STREAM, 0);
      if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        fprintf(stderr, "resolve: connect %s:%s: ", buf, port);
        perror(NULL);
        rc = 1;
      } else {
        printf("connected %s:%s\n", buf, port);
      }
      if (fd >= 0)
        close(fd);
    }
    freeaddrinfo(res);
  }
  return rc;
}
