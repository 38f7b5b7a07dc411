/* pause: the pod sandbox's init process for the FlightCache e2e cluster (our own pause image).
 * Holds the pod's namespaces, reaps zombies, and exits cleanly on SIGINT/SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

static void on_chld(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("pause flightcache-e2e");
    return 0;
  }
  if (getpid() != 1)
    fprintf(stderr, "pause: warning: not pid 1\n");
  struct sigaction term = {.sa_handler = on_term};
  struct sigaction chld = {.sa_handler = on_chld, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &chld, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;)
    pause();
}
