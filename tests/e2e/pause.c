/*
 * pause: the sandbox ("infra") process of a pod in the e2e suite's localhost/pause image
 * (tests/e2e/images.py builds it with `gcc -static -Os`).
 *
 * It holds the pod's namespaces open and does nothing else: it sleeps until SIGTERM or SIGINT
 * (exit 0), and as PID 1 of a pod that shares its PID namespace it reaps every child that the
 * kernel re-parents to it, so no zombie stays behind.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int signo) { (void)signo; stop = 1; }

static void on_child(int signo) {
  int saved = errno;
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

static int handle(int signo, void (*handler)(int)) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = handler;
  action.sa_flags = signo == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : 0;
  sigemptyset(&action.sa_mask);
  return sigaction(signo, &action, NULL);
}

int main(int argc, char **argv) {
  (void)argv;
  if (argc > 1) {
    fprintf(stderr, "pause takes no arguments\n");
    return 2;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not PID 1\n");
  /* the three signals are blocked except inside sigsuspend: none can slip in between the check and the wait */
  sigset_t blocked, waiting;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &blocked, &waiting) || handle(SIGTERM, on_stop) || handle(SIGINT, on_stop) ||
      handle(SIGCHLD, on_child)) {
    perror("pause: signals");
    return 1;
  }
  sigdelset(&waiting, SIGTERM);
  sigdelset(&waiting, SIGINT);
  sigdelset(&waiting, SIGCHLD);
  while (!stop) sigsuspend(&waiting);
  return 0;
}
