/* fastmock: a streaming OpenAI-style mock in C, one thread, for the bench (tests/bench/fastmock.py builds it).

   fastmock PORT TTFT_US ITL_US TRUTH_PATH

Why: the Python simulator on one core saturates near 1,600 req/s of 16-token streams on the shared 2-core VM,
so it cannot show whether one client core reaches 2,000 req/s (issue 29). This server does only what the
bench needs: fixed mode (token i of a request is due at arrival + TTFT + i x ITL), one event per token,
and a ground-truth line per request, as the simulator's --truth (request_id, arrival_ns, first_token_ns,
token_ns, lateness_ns; CLOCK_MONOTONIC ns, the clock the client stamps with).

Protocol: HTTP/1.1 on 127.0.0.1, keep-alive, one request at a time per connection (no pipelining).
POST /v1/completions (or /v1/chat/completions): a chunked text/event-stream of max_tokens events (16 when
the body has none), then a usage event, [DONE] and the last chunk, written with the last token. GET
/v1/models: a small JSON. Anything else: 404. arrival_ns is when the whole request (head and body) was read.
A request over 1 MiB closes its connection. SIGTERM/SIGINT: the truth file is flushed, exit 0.
Prints "listening PORT" on stdout once ready (PORT 0: the kernel's pick). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536
#define MAX_IN (1 << 20)

typedef struct {
    int open, streaming, chat;
    uint32_t gen;                 /* bumped per request and on close: a heap entry of an older one is stale */
    char *in; size_t in_len, in_cap;
    char *out; size_t out_len, out_cap;   /* bytes the socket did not take yet */
    char id[129];
    int64_t arrival_ns;
    int n, sent;
    int64_t *tok_ns, *late_ns;
} Conn;

typedef struct { int64_t due; int fd; uint32_t gen; } Ev;

static Conn conns[MAX_FDS];
static Ev *heap; static size_t heap_n, heap_cap;
static int64_t ttft_ns, itl_ns;
static int ep, tfd;
static FILE *truth;
static volatile sig_atomic_t stop;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    p = realloc(p, c * elem);
    if (!p) { perror("realloc"); exit(1); }
    *cap = c;
    return p;
}

static void heap_push(Ev e) {
    heap = grow(heap, &heap_cap, heap_n + 1, sizeof(Ev));
    size_t i = heap_n++;
    while (i && heap[(i - 1) / 2].due > e.due) { heap[i] = heap[(i - 1) / 2]; i = (i - 1) / 2; }
    heap[i] = e;
}

static Ev heap_pop(void) {
    Ev top = heap[0], last = heap[--heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= heap_n) break;
        if (c + 1 < heap_n && heap[c + 1].due < heap[c].due) c++;
        if (last.due <= heap[c].due) break;
        heap[i] = heap[c]; i = c;
    }
    if (heap_n) heap[i] = last;
    return top;
}

static void arm(void) {  /* the timer at the earliest due event (absolute), or disarmed */
    struct itimerspec its = {0};
    if (heap_n) {
        int64_t d = heap[0].due;
        its.it_value.tv_sec = d / 1000000000LL; its.it_value.tv_nsec = d % 1000000000LL;
        if (!its.it_value.tv_sec && !its.it_value.tv_nsec) its.it_value.tv_nsec = 1;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void close_conn(int fd) {
    Conn *c = &conns[fd];
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    c->open = c->streaming = 0; c->gen++;
    c->in_len = c->out_len = 0;
}

static void send_bytes(int fd, const char *p, size_t n) {
    Conn *c = &conns[fd];
    if (!c->out_len) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno != EAGAIN) { close_conn(fd); return; }
        if (w < 0) w = 0;
        p += w; n -= (size_t)w;
        if (!n) return;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    }
    c->out = grow(c->out, &c->out_cap, c->out_len + n, 1);
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

static void flush_out(int fd) {
    Conn *c = &conns[fd];
    ssize_t w = write(fd, c->out, c->out_len);
    if (w < 0) { if (errno != EAGAIN) close_conn(fd); return; }
    memmove(c->out, c->out + w, c->out_len - (size_t)w);
    c->out_len -= (size_t)w;
    if (!c->out_len) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    }
}

static void send_chunk(int fd, const char *payload, size_t n, int last) {
    /* one HTTP chunk; the last one also carries the terminating zero chunk */
    char buf[4096];
    int h = snprintf(buf, sizeof buf, "%zx\r\n", n);
    if (h + n + 7 > sizeof buf) { close_conn(fd); return; }
    memcpy(buf + h, payload, n);
    size_t len = (size_t)h + n;
    memcpy(buf + len, "\r\n", 2); len += 2;
    if (last) { memcpy(buf + len, "0\r\n\r\n", 5); len += 5; }
    send_bytes(fd, buf, len);
}

static void write_truth(Conn *c) {
    fprintf(truth, "{\"request_id\":\"%s\",\"arrival_ns\":%lld,\"first_token_ns\":%lld,\"token_ns\":[", c->id,
            (long long)c->arrival_ns, (long long)(c->n ? c->tok_ns[0] : 0));
    for (int i = 0; i < c->n; i++) fprintf(truth, i ? ",%lld" : "%lld", (long long)c->tok_ns[i]);
    fputs("],\"lateness_ns\":[", truth);
    for (int i = 0; i < c->n; i++) fprintf(truth, i ? ",%lld" : "%lld", (long long)c->late_ns[i]);
    fputs("]}\n", truth);
}

static void emit(int fd) {  /* the next token of fd's stream (its due time has come) */
    Conn *c = &conns[fd];
    int i = c->sent;
    int64_t t = now_ns();
    c->tok_ns[i] = t;
    c->late_ns[i] = t - (c->arrival_ns + ttft_ns + (int64_t)i * itl_ns);
    c->sent++;
    int last = c->sent == c->n;
    char p[3072];
    size_t n;
    if (c->chat)
        n = (size_t)snprintf(p, 1024, "data: {\"id\":\"chatcmpl-%s\",\"object\":\"chat.completion.chunk\",\"model\":\"m\","
                             "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":%s}]}\n\n",
                             c->id, last ? "\"length\"" : "null");
    else
        n = (size_t)snprintf(p, 1024, "data: {\"id\":\"cmpl-%s\",\"object\":\"text_completion\",\"model\":\"m\","
                             "\"choices\":[{\"index\":0,\"text\":\"tok \",\"finish_reason\":%s}]}\n\n",
                             c->id, last ? "\"length\"" : "null");
    if (last) {
        n += (size_t)snprintf(p + n, sizeof p - n, "data: {\"id\":\"cmpl-%s\",\"model\":\"m\",\"choices\":[],\"usage\":"
                              "{\"prompt_tokens\":16,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n",
                              c->id, c->n, c->n + 16);
        write_truth(c);
        c->streaming = 0;
    }
    send_chunk(fd, p, n, last);
    if (!last && conns[fd].open) heap_push((Ev){c->arrival_ns + ttft_ns + (int64_t)c->sent * itl_ns, fd, c->gen});
}

static const char *find_header(const char *head, size_t len, const char *name, size_t *vlen) {
    /* the value of header `name` (case-insensitive) in head[0:len], trimmed; NULL if absent */
    size_t nl = strlen(name);
    const char *p = memchr(head, '\n', len), *end = head + len;
    while (p && p + 1 < end) {
        const char *line = p + 1;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        if ((size_t)(eol - line) > nl && !strncasecmp(line, name, nl) && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t')) v++;
            const char *e = eol;
            while (e > v && (e[-1] == '\r' || e[-1] == ' ')) e--;
            *vlen = (size_t)(e - v);
            return v;
        }
        p = eol < end ? eol : NULL;
    }
    return NULL;
}

static void respond_plain(int fd, int status, const char *reason, const char *body) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     status, reason, strlen(body), body);
    send_bytes(fd, buf, (size_t)n);
}

static void start_stream(int fd, const char *head, size_t head_len, const char *body, size_t body_len, int chat) {
    Conn *c = &conns[fd];
    size_t vl = 0;
    const char *v = find_header(head, head_len, "X-Request-Id", &vl);
    if (!v || !vl) { v = "none"; vl = 4; }
    if (vl > 128) vl = 128;
    for (size_t i = 0; i < vl; i++) c->id[i] = (v[i] == '"' || v[i] == '\\' || (unsigned char)v[i] < 32) ? '_' : v[i];
    c->id[vl] = 0;
    int n = 16;
    const char *m = memmem(body, body_len, "\"max_tokens\":", 13);
    if (m) { n = atoi(m + 13); if (n < 1) n = 1; if (n > 100000) n = 100000; }
    c->n = n; c->sent = 0; c->chat = chat; c->streaming = 1; c->gen++;
    c->tok_ns = realloc(c->tok_ns, (size_t)n * sizeof(int64_t));
    c->late_ns = realloc(c->late_ns, (size_t)n * sizeof(int64_t));
    c->arrival_ns = now_ns();
    char h[256];
    int hn = snprintf(h, sizeof h, "HTTP/1.1 200 OK\r\nX-Request-Id: %s\r\nContent-Type: text/event-stream\r\n"
                      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n", c->id);
    send_bytes(fd, h, (size_t)(hn < (int)sizeof h ? hn : (int)sizeof h - 1));
    if (conns[fd].open) heap_push((Ev){c->arrival_ns + ttft_ns, fd, c->gen});
}

static void handle_input(int fd) {
    Conn *c = &conns[fd];
    while (c->open && !c->streaming && c->in_len) {
        char *hend = memmem(c->in, c->in_len, "\r\n\r\n", 4);
        if (!hend) { if (c->in_len > MAX_IN) close_conn(fd); return; }
        size_t head_len = (size_t)(hend - c->in) + 4, cl = 0, vl = 0;
        const char *v = find_header(c->in, head_len, "Content-Length", &vl);
        if (v) cl = strtoul(v, NULL, 10);
        if (head_len + cl > MAX_IN) { close_conn(fd); return; }
        if (c->in_len < head_len + cl) return;
        if (!strncmp(c->in, "POST /v1/completions ", 21)) start_stream(fd, c->in, head_len, hend + 4, cl, 0);
        else if (!strncmp(c->in, "POST /v1/chat/completions ", 26)) start_stream(fd, c->in, head_len, hend + 4, cl, 1);
        else if (!strncmp(c->in, "GET /v1/models ", 15))
            respond_plain(fd, 200, "OK", "{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\",\"owned_by\":\"fastmock\"}]}");
        else respond_plain(fd, 404, "Not Found", "{\"error\":{\"message\":\"not served by fastmock\"}}");
        if (!c->open) return;
        memmove(c->in, c->in + head_len + cl, c->in_len - head_len - cl);
        c->in_len -= head_len + cl;
    }
}

static void on_readable(int fd) {
    Conn *c = &conns[fd];
    for (;;) {
        c->in = grow(c->in, &c->in_cap, c->in_len + 65536, 1);
        ssize_t r = read(fd, c->in + c->in_len, 65536);
        if (r > 0) { c->in_len += (size_t)r; continue; }
        if (r == 0 || errno != EAGAIN) { close_conn(fd); return; }
        break;
    }
    handle_input(fd);
}

static void on_signal(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: fastmock PORT TTFT_US ITL_US TRUTH_PATH\n"); return 2; }
    ttft_ns = atoll(argv[2]) * 1000LL; itl_ns = atoll(argv[3]) * 1000LL;
    truth = fopen(argv[4], "w");
    if (!truth) { perror(argv[4]); return 2; }
    setvbuf(truth, NULL, _IOFBF, 1 << 20);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL); sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL);  /* the kernel's default 50 us of timer slack would be most of the lateness */
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4096)) { perror("bind/listen"); return 1; }
    socklen_t al = sizeof a;
    getsockname(ls, (struct sockaddr *)&a, &al);
    ep = epoll_create1(0);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    ev.data.fd = tfd;
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
    printf("listening %d\n", ntohs(a.sin_port));
    fflush(stdout);
    struct epoll_event evs[256];
    while (!stop) {
        int k = epoll_wait(ep, evs, 256, -1);
        if (k < 0) { if (errno == EINTR) continue; perror("epoll_wait"); return 1; }
        for (int e = 0; e < k; e++) {
            int fd = evs[e].data.fd;
            if (fd == ls) {
                int s;
                while ((s = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (s >= MAX_FDS) { close(s); continue; }
                    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conns[s].open = 1; conns[s].streaming = 0; conns[s].gen++;
                    conns[s].in_len = conns[s].out_len = 0;
                    struct epoll_event ce = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = s};
                    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ce);
                }
            } else if (fd == tfd) {
                uint64_t x;
                if (read(tfd, &x, sizeof x) < 0) { /* a spurious wake: the heap says what is due */ }
            } else {
                if (evs[e].events & EPOLLOUT && conns[fd].open) flush_out(fd);
                if (evs[e].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR) && conns[fd].open) on_readable(fd);
            }
        }
        int64_t t = now_ns();
        while (heap_n && heap[0].due <= t) {
            Ev x = heap_pop();
            if (conns[x.fd].open && conns[x.fd].streaming && conns[x.fd].gen == x.gen) {
                emit(x.fd);
                if (!conns[x.fd].streaming && conns[x.fd].open) handle_input(x.fd);  /* a request already waiting */
            }
        }
        arm();
    }
    fclose(truth);
    return 0;
}
