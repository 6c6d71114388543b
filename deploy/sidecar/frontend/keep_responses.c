/*
 * The response keeper, preloaded into tritonserver (LD_PRELOAD).
 *
 * Triton's HTTP frontend hands each generate_stream response to the event thread of its
 * connection with libevhtp's evthr_defer: a 17-byte command sent on a non-blocking AF_UNIX
 * socket pair, whose failure is ignored. When the event thread is behind by as many commands
 * as the socket's buffer holds, send() fails with EAGAIN and the response is lost.
 *
 * This send() makes room instead, for such commands only: 17 bytes, no MSG_DONTWAIT, an
 * AF_UNIX socket. First it grows the socket's send buffer to GROW_BYTES, or to what the host's
 * net.core.wmem_max allows (never shrinking it), so that a thread may fall further behind
 * without anyone waiting; when that is full too, it waits for room and sends again: the thread
 * that completes a response then waits for the event thread, as gRPC's flow control makes it
 * wait for a slow client. The wait is bounded (KEEP_WAIT_MS), so a command deferred by the
 * event thread to itself is lost as before rather than blocking it for good. Every other call
 * returns what libc's send() returns.
 *
 * Loaded into tritonserver, it takes itself out of LD_PRELOAD, so that the processes
 * tritonserver starts (the Python backend's stubs among them) run without it. A process of
 * another name (a launcher that execs tritonserver) passes it on.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#define EVTHR_COMMAND_BYTES 17
#define KEEP_WAIT_MS 10000
#define POLL_MS 100
#define GROW_BYTES (8L * 1024 * 1024)
#define WMEM_MAX "/proc/sys/net/core/wmem_max"
#define SERVER "tritonserver"

typedef ssize_t (*send_fn)(int, const void *, size_t, int);
static send_fn libc_send;
static int grown_bytes; /* SO_SNDBUF as read back once grown; 0: unknown, never grown */

static void keeper_init(void) {
    libc_send = (send_fn)dlsym(RTLD_NEXT, "send");
    char text[32] = {0};
    long most = 0;
    int limit = open(WMEM_MAX, O_RDONLY | O_CLOEXEC);
    if (limit >= 0) {
        if (read(limit, text, sizeof text - 1) > 0) {
            most = strtol(text, NULL, 10);
        }
        close(limit);
    }
    /* The kernel doubles what setsockopt asks for, up to twice net.core.wmem_max. */
    grown_bytes = (int)(2 * (most < GROW_BYTES ? most : GROW_BYTES));
}

/* LD_PRELOAD without this library, for the processes started from here on. */
static void leave_children(void) {
    Dl_info self;
    const char *preload = getenv("LD_PRELOAD");
    if (preload == NULL || dladdr((void *)&leave_children, &self) == 0 || self.dli_fname == NULL) {
        return;
    }
    size_t own = strlen(self.dli_fname);
    char *kept = malloc(strlen(preload) + 1);
    if (kept == NULL) {
        return;
    }
    size_t used = 0;
    for (const char *entry = preload; *entry != '\0';) {
        size_t size = strcspn(entry, ": ");
        if (size > 0 && !(size == own && strncmp(entry, self.dli_fname, size) == 0)) {
            if (used > 0) {
                kept[used++] = ':';
            }
            memcpy(kept + used, entry, size);
            used += size;
        }
        entry += size;
        if (*entry != '\0') {
            entry++;
        }
    }
    kept[used] = '\0';
    if (used > 0) {
        setenv("LD_PRELOAD", kept, 1);
    } else {
        unsetenv("LD_PRELOAD");
    }
    free(kept);
}

__attribute__((constructor)) static void keeper_load(void) {
    keeper_init();
    if (strcmp(program_invocation_short_name, SERVER) == 0) {
        leave_children();
    }
}

/* Whether the socket's send buffer was grown (it is never shrunk). */
static int grow(int fd) {
    int current = 0;
    socklen_t size = sizeof current;
    if (grown_bytes <= 0 || getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &current, &size) != 0 ||
        current >= grown_bytes) {
        return 0;
    }
    int asked = grown_bytes / 2;
    return setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &asked, sizeof asked) == 0;
}

/* A non-blocking AF_UNIX socket, as evthr's command socket is. */
static int is_unix_socket(int fd) {
    int domain = 0;
    socklen_t size = sizeof domain;
    int status = fcntl(fd, F_GETFL);
    return status >= 0 && (status & O_NONBLOCK) &&
           getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size) == 0 && domain == AF_UNIX;
}

static int full(ssize_t sent) {
    return sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    if (libc_send == NULL) {
        keeper_init();
    }
    ssize_t sent = libc_send(fd, buf, len, flags);
    if (!full(sent) || len != EVTHR_COMMAND_BYTES || (flags & MSG_DONTWAIT) || !is_unix_socket(fd)) {
        if (full(sent)) {
            errno = EAGAIN;
        }
        return sent;
    }
    if (grow(fd)) {
        sent = libc_send(fd, buf, len, flags);
        if (!full(sent)) {
            return sent;
        }
    }
    for (int waited_ms = 0; waited_ms < KEEP_WAIT_MS; waited_ms += POLL_MS) {
        struct pollfd room = {.fd = fd, .events = POLLOUT};
        if (poll(&room, 1, POLL_MS) < 0 && errno != EINTR) {
            return -1;
        }
        sent = libc_send(fd, buf, len, flags);
        if (!full(sent)) {
            return sent;
        }
    }
    errno = EAGAIN;
    return sent;
}
