/*
 * simtool: the simulated talosctl/helm as a process that costs about what the real Go binary costs.
 *
 * Why: each simulated tool call used to be a new Python process (~45-85 ms of CPU before it reached a
 * node), where the real talosctl is a Go binary that starts in a few ms.  At 1,000 nodes that start-up,
 * not the runbook, decided the benchmarks.  This client hands its argv, environment, working directory
 * and its own stdin/stdout/stderr (SCM_RIGHTS) to the simulator's tool server, which forks a copy of a
 * Python process that has already imported the simulator; the copy runs the same main() the plain
 * `python -m` path runs, writes straight into this process's streams, and sends back the exit code.
 * Outputs, streams and exit codes are therefore the same as without the server.  When no server
 * listens (no daemon, or it stopped), when the listener is not this user's (SO_PEERCRED: another user
 * bound the name first), or with RUNBOOK_SIM_TOOLSERVER=0 in the environment, the client execs
 * `PYTHON -m MODULE args...` as before.
 *
 * usage: simtool SOCKET-NAME PYTHON MODULE [args...]   (SOCKET-NAME: abstract unix socket, without '@')
 * wire:  16 ASCII digits (payload length), then the payload: NUL-terminated strings
 *        "1", MODULE, cwd, argc, argv..., envc, "KEY=VALUE"...
 *        and back: the exit code as ASCII digits, then EOF.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

static void fallback(char **argv, int argc) {
    /* argv: simtool SOCK PYTHON MODULE args... -> PYTHON -m MODULE args... */
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    if (!args) { perror("simtool"); exit(1); }
    args[0] = argv[2];
    args[1] = "-m";
    args[2] = argv[3];
    for (int i = 4; i < argc; i++) args[i - 1] = argv[i];
    args[argc - 1] = NULL;
    execv(argv[2], args);
    fprintf(stderr, "simtool: cannot run %s: %s\n", argv[2], strerror(errno));
    exit(127);
}

/* An abstract socket name has no owner: any local user can bind it before the simulator's daemon does.
   The kernel records who listens (SO_PEERCRED); only a server running as this user may see the call. */
static int server_is_ours(int sock) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof cred) return 0;
    return cred.uid == geteuid();
}

struct buf { char *data; size_t len, cap; };

static void put(struct buf *b, const char *s) {
    size_t n = strlen(s) + 1;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) { perror("simtool"); exit(1); }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: simtool SOCKET-NAME PYTHON MODULE [args...]\n");
        return 2;
    }
    const char *off = getenv("RUNBOOK_SIM_TOOLSERVER");
    if (off && strcmp(off, "0") == 0) fallback(argv, argc);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    size_t name_len = strlen(argv[1]);
    if (name_len + 1 > sizeof addr.sun_path) fallback(argv, argc);
    memcpy(addr.sun_path + 1, argv[1], name_len); /* abstract namespace: leading NUL */
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) fallback(argv, argc);
    if (connect(sock, (struct sockaddr *)&addr, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + name_len)) < 0) {
        close(sock);
        fallback(argv, argc);
    }
    if (!server_is_ours(sock)) {
        /* Another user bound the name first: it must get nothing (no environment, no streams) and answer
           nothing.  The plain process gives the same result, without the server. */
        close(sock);
        fallback(argv, argc);
    }

    /* A closed stdin/stdout/stderr cannot be sent: stand in /dev/null, as the kernel would give Go. */
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) < 0) {
            int nul = open("/dev/null", O_RDWR);
            if (nul >= 0 && nul != fd) { dup2(nul, fd); close(nul); }
        }
    }

    struct buf b = {0};
    char num[32], cwd[PATH_MAX];
    put(&b, "1");
    put(&b, argv[3]);
    put(&b, getcwd(cwd, sizeof cwd) ? cwd : "/");
    snprintf(num, sizeof num, "%d", argc - 4);
    put(&b, num);
    for (int i = 4; i < argc; i++) put(&b, argv[i]);
    int envc = 0;
    for (char **e = environ; *e; e++) envc++;
    snprintf(num, sizeof num, "%d", envc);
    put(&b, num);
    for (char **e = environ; *e; e++) put(&b, *e);

    char header[17];
    snprintf(header, sizeof header, "%016zu", b.len);
    struct iovec iov = {.iov_base = header, .iov_len = 16};
    int fds[3] = {0, 1, 2};
    union { char buf[CMSG_SPACE(sizeof fds)]; struct cmsghdr align; } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    ssize_t sent;
    do { sent = sendmsg(sock, &msg, MSG_NOSIGNAL); } while (sent < 0 && errno == EINTR);
    if (sent != 16 || write_all(sock, b.data, b.len) < 0) {
        /* Nothing has run yet: the server went away between connect and send. */
        close(sock);
        fallback(argv, argc);
    }

    char reply[32];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(sock, reply + got, sizeof reply - 1 - got);
        if (r < 0) { if (errno == EINTR) continue; break; }
        if (r == 0 || (got += (size_t)r) >= sizeof reply - 1) break;
    }
    reply[got] = '\0';
    if (got == 0) {
        fprintf(stderr, "simtool: the simulator's tool server ended the call without an exit code\n");
        return 1;
    }
    return atoi(reply);
}
