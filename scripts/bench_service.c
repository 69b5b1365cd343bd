/* The HTTP service of scripts/bench_concurrency.py: answers each request DELAY_MS after it arrived, on
   kept-alive HTTP/1.1 connections (closed when a request asks). In C so that its own CPU stays small: the
   asyncio service it replaces took ~0.5 of this machine's 2 cores at 5,000 requests a second, CPU the
   workers under test did not have, where a remote service costs them nothing. This one takes ~0.15.
   One epoll loop. The delay is the same for every request, so answers fall due in the order requests
   arrived: a FIFO, and one timerfd (nanosecond deadlines; epoll_wait's own timeout rounds up to the
   millisecond) armed for its head. Usage: bench_service PORT DELAY_MS */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define BUF 65536
#define QUEUE 65536 /* answers waiting: at most one per connection, and fewer connections than this */
static const char OK[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}";
static const char OK_CLOSE[] =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}";

struct conn {
    int fd, waiting, closing, dead;
    size_t len;
    char buf[BUF];
};
static struct { struct conn *c; long long due; } queue[QUEUE];
static size_t head, tail;
static long long delay_ns, armed;
static int ep, timer;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void drop(struct conn *c) { /* freed here, or when its waiting answer leaves the queue */
    if (!c->dead) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->dead = 1;
    }
    if (!c->waiting) free(c);
}

/* A whole request at the front of the buffer: take it off and queue its answer. */
static void take(struct conn *c, long long arrived) {
    char *end = c->waiting ? NULL : memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!end) return;
    size_t size = end - c->buf + 4, body = 0;
    for (char *p = c->buf; p < end; p++) {
        if (p != c->buf && p[-1] != '\n') continue;
        if (strncasecmp(p, "content-length:", 15) == 0) body = strtoul(p + 15, NULL, 10);
        if (strncasecmp(p, "connection: close", 17) == 0) c->closing = 1;
    }
    if (body > BUF) body = BUF; /* never whole: the connection is dropped once its buffer is full */
    if (c->len < size + body) return;
    memmove(c->buf, c->buf + size + body, c->len - size - body);
    c->len -= size + body;
    c->waiting = 1;
    queue[tail % QUEUE].c = c;
    queue[tail % QUEUE].due = arrived + delay_ns;
    tail++;
}

static void arm(void) {
    long long due = head < tail ? queue[head % QUEUE].due : 0;
    if (due == armed) return;
    struct itimerspec at = {0};
    at.it_value.tv_sec = due / 1000000000LL;
    at.it_value.tv_nsec = due % 1000000000LL;
    timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, NULL);
    armed = due;
}

static void answer_due(void) {
    long long now = now_ns();
    while (head < tail && queue[head % QUEUE].due <= now) {
        struct conn *c = queue[head++ % QUEUE].c;
        c->waiting = 0;
        if (c->dead) { free(c); continue; }
        const char *text = c->closing ? OK_CLOSE : OK;
        size_t size = c->closing ? sizeof OK_CLOSE - 1 : sizeof OK - 1;
        /* An answer is ~100 bytes: a send cuts it short only for a client that pipelines and never reads. */
        if (send(c->fd, text, size, MSG_NOSIGNAL) != (ssize_t)size || c->closing) { drop(c); continue; }
        take(c, now); /* a request sent before this answer came (pipelined) */
    }
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: service PORT DELAY_MS\n"); return 2; }
    delay_ns = (long long)(atof(argv[2]) * 1e6);
    int one = 1, ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(ls, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 4096)) { perror("service"); return 1; }
    ep = epoll_create1(0);
    timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    static int listen_tag, timer_tag;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag}, events[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    ev.data.ptr = &timer_tag;
    epoll_ctl(ep, EPOLL_CTL_ADD, timer, &ev);
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        long long now = now_ns();
        for (int i = 0; i < n; i++) {
            void *tag = events[i].data.ptr;
            if (tag == &listen_tag) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    struct conn *c = calloc(1, sizeof *c);
                    c->fd = fd;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                }
            } else if (tag == &timer_tag) {
                unsigned long long ticks;
                if (read(timer, &ticks, sizeof ticks) == sizeof ticks) armed = 0;
            } else {
                struct conn *c = tag;
                if (c->dead) continue;
                ssize_t got = read(c->fd, c->buf + c->len, BUF - c->len);
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                /* The end of the connection, or a request larger than the buffer. A client that half-closes
                   after its request loses its answer: the bench's never does. */
                if (got <= 0 || (c->len += got) == BUF) { drop(c); continue; }
                take(c, now);
            }
        }
        answer_due();
        arm();
    }
}
