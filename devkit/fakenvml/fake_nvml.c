/*
 * A stand-in for libnvidia-ml.so.1, for tests on machines without an NVIDIA GPU.
 *
 * It implements the handful of NVML entry points that pynvml and enricher.nvml call, with
 * the real return codes, struct layouts and two-call (size, then fill) protocols. What it
 * reports comes from a line-based text file named by $FAKE_NVML_STATE, re-read on every
 * init and every nvmlDeviceGetCount_v2, so a test can change the GPUs between two scrapes.
 * devkit/nvmlfake.py writes that file; its docstring describes the format. With
 * $FAKE_NVML_RELOAD=changed, nvmlDeviceGetCount_v2 re-reads it only when it changed (its
 * inode, size or mtime): the benchmark sets it, so that what it times is the caller's work
 * and not this library parsing text, which real NVML never does.
 *
 * When $FAKE_NVML_LOG names a file, every call appends one line "<symbol> <device> [args]"
 * to it, so tests can see which symbols were tried and which timestamp was passed. Calls
 * with a two-call protocol log "size" (no buffer) or "fill" as their first argument.
 *
 * Every table has a fixed size; a state file that does not fit (or does not parse) makes
 * init and nvmlDeviceGetCount_v2 fail with NVML_ERROR_UNKNOWN instead of overflowing.
 *
 * A "hang SYMBOL DEV" line makes SYMBOL block forever for DEV (a wedged driver): it logs
 * "hang" and waits in pause(), so a test can check that nothing waits on it for good.
 *
 * GPUs come and go as in real NVML: the device count and each index's handle are fixed when
 * the library is first initialised (nvmlInit with no init outstanding), whatever the state
 * file says later; a handle stays bound to its GPU (its UUID), wherever the state lists it
 * now. A GPU the state no longer lists, or lists with another "bind" generation (unbound
 * from the driver and bound again), answers NVML_ERROR_GPU_IS_LOST through its handle and
 * its MIG devices' handles, and nvmlDeviceGetHandleByIndex answers it for its index; a GPU
 * the state adds is seen by the next init only. Processes, samples, MIG instances, power and
 * fail rules name GPUs by their index in the state as it is now.
 *
 * Build variants: -DFAKE_NVML_NO_V3 / -DFAKE_NVML_NO_V2 / -DFAKE_NVML_NO_V1 leave out the
 * process-list symbols of that version, to exercise the real missing-symbol path.
 */

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999
#define FAKE_HANG (-1) /* a fail rule with this code blocks instead of returning */

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFU

#define FAKE_MAX_GPUS 64
#define FAKE_MAX_MIGS 8
#define FAKE_MAX_PROCS 4096
#define FAKE_MAX_SAMPLES 4096
#define FAKE_MAX_FAILS 64
#define FAKE_STR 96
#define FAKE_FN 80
#define FAKE_LINE 512
#define FAKE_TOTAL_MEMORY (80ULL << 30)

typedef struct nvmlDevice_st {
    int gpu;
    int slot; /* -1: the full GPU; otherwise the MIG slot */
} *nvmlDevice_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* A device selector from the state file: "*", "G", "G/GI" or "G/GI/CI"; -1 means any. */
struct dev_sel {
    int all;
    int gpu;
    int gi;
    int ci;
};

struct fake_gpu {
    char uuid[FAKE_STR];
    char name[FAKE_STR];
    int mig; /* 0 off, 1 on, -1 not supported */
    int has_power; /* 0: power and energy readings are NOT_SUPPORTED (no "power" line) */
    unsigned int binding; /* times bound to the driver again ("bind" line); 0 without */
    unsigned int power_mw;
    unsigned long long energy_mj;
};

struct fake_mig {
    int present;
    unsigned int gi;
    unsigned int ci;
    char uuid[FAKE_STR];
    char name[FAKE_STR];
};

enum { LIST_COMPUTE, LIST_GRAPHICS, LIST_MPS };

struct fake_proc {
    struct dev_sel dev;
    unsigned int pid;
    unsigned long long mem;
    int list;
};

struct fake_sample {
    struct dev_sel dev;
    unsigned int pid;
    unsigned long long ts;
    unsigned int sm;
    unsigned int mem;
};

struct fake_fail {
    char fn[FAKE_FN];
    struct dev_sel dev;
    nvmlReturn_t code;
};

struct fake_state {
    nvmlReturn_t status; /* non-zero: every call returns this (no state, bad state) */
    char driver[80];
    int ngpus;
    struct fake_gpu gpus[FAKE_MAX_GPUS];
    struct fake_mig migs[FAKE_MAX_GPUS][FAKE_MAX_MIGS];
    int nprocs;
    struct fake_proc procs[FAKE_MAX_PROCS];
    int nsamples;
    struct fake_sample samples[FAKE_MAX_SAMPLES];
    int nfails;
    struct fake_fail fails[FAKE_MAX_FAILS];
};

static struct fake_state g_state;
static struct fake_state g_next; /* parsed into first, so a bad file never leaves half a state */
static struct nvmlDevice_st g_gpu_handles[FAKE_MAX_GPUS];
static struct nvmlDevice_st g_mig_handles[FAKE_MAX_GPUS][FAKE_MAX_MIGS];
static int g_init_count;
/* The GPUs as the first init found them: the count, each index's UUID and binding (see the
 * top), and where each is in the current state (-1: lost). */
static int g_bound_count;
static char g_bound_uuid[FAKE_MAX_GPUS][FAKE_STR];
static unsigned int g_bound_binding[FAKE_MAX_GPUS];
static int g_where[FAKE_MAX_GPUS];

/* ------------------------------------------------------------------ call log */

static void fake_log(const char *fn, nvmlDevice_t dev, const char *fmt, ...)
{
    const char *path = getenv("FAKE_NVML_LOG");
    if (path == NULL || path[0] == '\0') {
        return;
    }
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        return;
    }
    fprintf(f, "%s", fn);
    if (dev == NULL) {
        fprintf(f, " -");
    } else if (dev->slot < 0) {
        fprintf(f, " gpu%d", dev->gpu);
    } else {
        fprintf(f, " gpu%d/mig%d", dev->gpu, dev->slot);
    }
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        fputc(' ', f);
        vfprintf(f, fmt, ap);
        va_end(ap);
    }
    fputc('\n', f);
    fclose(f);
}

/* ------------------------------------------------------------------ state file */

static int parse_uint(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    if (s == NULL || *s < '0' || *s > '9') {
        return -1;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (end == NULL || *end != '\0' || v > max) {
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_int(const char *s, int max, int *out)
{
    unsigned long long v;
    if (parse_uint(s, (unsigned long long)max, &v) != 0) {
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_dev(const char *s, struct dev_sel *d)
{
    char buf[64];
    int parts[3] = {-1, -1, -1};
    int n = 0;
    memset(d, 0, sizeof(*d));
    if (strcmp(s, "*") == 0) {
        d->all = 1;
        d->gpu = d->gi = d->ci = -1;
        return 0;
    }
    if (strlen(s) >= sizeof(buf)) {
        return -1;
    }
    strcpy(buf, s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, "/", &save); tok != NULL; tok = strtok_r(NULL, "/", &save)) {
        if (n >= 3 || parse_int(tok, 1 << 20, &parts[n]) != 0) {
            return -1;
        }
        n++;
    }
    if (n == 0) {
        return -1;
    }
    d->gpu = parts[0];
    d->gi = parts[1];
    d->ci = parts[2];
    return 0;
}

static int copy_str(char *dst, size_t size, const char *src)
{
    if (src == NULL || strlen(src) >= size) {
        return -1;
    }
    strcpy(dst, src);
    return 0;
}

/* The remainder of a line after `skip` whitespace-separated fields (names contain spaces). */
static const char *rest_after(const char *line, int skip)
{
    const char *p = line;
    for (int i = 0; i < skip; i++) {
        while (*p == ' ' || *p == '\t') {
            p++;
        }
        while (*p != '\0' && *p != ' ' && *p != '\t') {
            p++;
        }
    }
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    return p;
}

static int parse_line(struct fake_state *st, char *line)
{
    char copy[FAKE_LINE];
    char *tok[8];
    int n = 0;
    char *save = NULL;

    strcpy(copy, line);
    for (char *t = strtok_r(copy, " \t", &save); t != NULL && n < 8;
         t = strtok_r(NULL, " \t", &save)) {
        tok[n++] = t;
    }
    if (n == 0 || tok[0][0] == '#') {
        return 0;
    }
    if (strcmp(tok[0], "driver") == 0 && n == 2) {
        return copy_str(st->driver, sizeof(st->driver), tok[1]);
    }
    if (strcmp(tok[0], "gpu") == 0 && n >= 5) {
        /* gpu INDEX UUID MIG(0|1|-) NAME... */
        int idx;
        if (parse_int(tok[1], FAKE_MAX_GPUS - 1, &idx) != 0 || idx != st->ngpus) {
            return -1;
        }
        struct fake_gpu *g = &st->gpus[idx];
        if (strcmp(tok[3], "-") == 0) {
            g->mig = -1;
        } else if (parse_int(tok[3], 1, &g->mig) != 0) {
            return -1;
        }
        if (copy_str(g->uuid, sizeof(g->uuid), tok[2]) != 0 ||
            copy_str(g->name, sizeof(g->name), rest_after(line, 4)) != 0) {
            return -1;
        }
        st->ngpus++;
        return 0;
    }
    if (strcmp(tok[0], "mig") == 0 && n >= 7) {
        /* mig GPU SLOT GI CI UUID NAME... */
        int gpu, slot, gi, ci;
        if (parse_int(tok[1], FAKE_MAX_GPUS - 1, &gpu) != 0 || gpu >= st->ngpus ||
            parse_int(tok[2], FAKE_MAX_MIGS - 1, &slot) != 0 ||
            parse_int(tok[3], 1 << 20, &gi) != 0 || parse_int(tok[4], 1 << 20, &ci) != 0) {
            return -1;
        }
        struct fake_mig *m = &st->migs[gpu][slot];
        if (m->present) {
            return -1;
        }
        m->present = 1;
        m->gi = (unsigned int)gi;
        m->ci = (unsigned int)ci;
        if (copy_str(m->uuid, sizeof(m->uuid), tok[5]) != 0 ||
            copy_str(m->name, sizeof(m->name), rest_after(line, 6)) != 0) {
            return -1;
        }
        return 0;
    }
    if (strcmp(tok[0], "power") == 0 && n == 4) {
        /* power GPU MILLIWATTS MILLIJOULES: nvmlDeviceGetPowerUsage, and
         * nvmlDeviceGetTotalEnergyConsumption (energy since the driver was loaded) */
        int gpu;
        unsigned long long mw, mj;
        if (parse_int(tok[1], FAKE_MAX_GPUS - 1, &gpu) != 0 || gpu >= st->ngpus ||
            parse_uint(tok[2], 0xFFFFFFFFULL, &mw) != 0 ||
            parse_uint(tok[3], NVML_VALUE_NOT_AVAILABLE_ULL - 1, &mj) != 0) {
            return -1;
        }
        st->gpus[gpu].has_power = 1;
        st->gpus[gpu].power_mw = (unsigned int)mw;
        st->gpus[gpu].energy_mj = mj;
        return 0;
    }
    if (strcmp(tok[0], "bind") == 0 && n == 3) {
        /* bind GPU GENERATION: the GPU was unbound and bound again that many times */
        int gpu;
        unsigned long long gen;
        if (parse_int(tok[1], FAKE_MAX_GPUS - 1, &gpu) != 0 || gpu >= st->ngpus ||
            parse_uint(tok[2], 1 << 20, &gen) != 0) {
            return -1;
        }
        st->gpus[gpu].binding = (unsigned int)gen;
        return 0;
    }
    if (strcmp(tok[0], "proc") == 0 && n == 5) {
        /* proc DEV PID MEM|na compute|graphics|mps */
        if (st->nprocs >= FAKE_MAX_PROCS) {
            return -1;
        }
        struct fake_proc *p = &st->procs[st->nprocs];
        unsigned long long pid;
        if (parse_dev(tok[1], &p->dev) != 0 || p->dev.all ||
            parse_uint(tok[2], 0xFFFFFFFFULL, &pid) != 0) {
            return -1;
        }
        p->pid = (unsigned int)pid;
        if (strcmp(tok[3], "na") == 0) {
            p->mem = NVML_VALUE_NOT_AVAILABLE_ULL;
        } else if (parse_uint(tok[3], NVML_VALUE_NOT_AVAILABLE_ULL - 1, &p->mem) != 0) {
            return -1;
        }
        if (strcmp(tok[4], "compute") == 0) {
            p->list = LIST_COMPUTE;
        } else if (strcmp(tok[4], "graphics") == 0) {
            p->list = LIST_GRAPHICS;
        } else if (strcmp(tok[4], "mps") == 0) {
            p->list = LIST_MPS;
        } else {
            return -1;
        }
        st->nprocs++;
        return 0;
    }
    if (strcmp(tok[0], "util") == 0 && (n == 5 || n == 6)) {
        /* util DEV PID TIMESTAMP SM [MEM] */
        if (st->nsamples >= FAKE_MAX_SAMPLES) {
            return -1;
        }
        struct fake_sample *s = &st->samples[st->nsamples];
        unsigned long long pid, sm, mem = 0;
        if (parse_dev(tok[1], &s->dev) != 0 || s->dev.all ||
            parse_uint(tok[2], 0xFFFFFFFFULL, &pid) != 0 ||
            parse_uint(tok[3], NVML_VALUE_NOT_AVAILABLE_ULL - 1, &s->ts) != 0 ||
            parse_uint(tok[4], 0xFFFFFFFFULL, &sm) != 0 ||
            (n == 6 && parse_uint(tok[5], 0xFFFFFFFFULL, &mem) != 0)) {
            return -1;
        }
        s->pid = (unsigned int)pid;
        s->sm = (unsigned int)sm;
        s->mem = (unsigned int)mem;
        st->nsamples++;
        return 0;
    }
    if (strcmp(tok[0], "fail") == 0 && n == 4) {
        /* fail SYMBOL DEV CODE */
        if (st->nfails >= FAKE_MAX_FAILS) {
            return -1;
        }
        struct fake_fail *f = &st->fails[st->nfails];
        int code;
        if (copy_str(f->fn, sizeof(f->fn), tok[1]) != 0 || parse_dev(tok[2], &f->dev) != 0 ||
            parse_int(tok[3], 100000, &code) != 0) {
            return -1;
        }
        f->code = code;
        st->nfails++;
        return 0;
    }
    if (strcmp(tok[0], "hang") == 0 && n == 3) {
        /* hang SYMBOL DEV */
        if (st->nfails >= FAKE_MAX_FAILS) {
            return -1;
        }
        struct fake_fail *f = &st->fails[st->nfails];
        if (copy_str(f->fn, sizeof(f->fn), tok[1]) != 0 || parse_dev(tok[2], &f->dev) != 0) {
            return -1;
        }
        f->code = FAKE_HANG;
        st->nfails++;
        return 0;
    }
    return -1;
}

static void init_handles(void)
{
    for (int g = 0; g < FAKE_MAX_GPUS; g++) {
        g_gpu_handles[g].gpu = g;
        g_gpu_handles[g].slot = -1;
        for (int m = 0; m < FAKE_MAX_MIGS; m++) {
            g_mig_handles[g][m].gpu = g;
            g_mig_handles[g][m].slot = m;
        }
    }
}

/* What the state was last loaded from, for FAKE_NVML_RELOAD=changed. */
static struct stat g_loaded;
static int g_loaded_valid = 0;

/* 1 when FAKE_NVML_RELOAD=changed and the state file is the one loaded last. */
static int state_unchanged(void)
{
    const char *mode = getenv("FAKE_NVML_RELOAD");
    const char *path = getenv("FAKE_NVML_STATE");
    struct stat st;
    if (!g_loaded_valid || mode == NULL || strcmp(mode, "changed") != 0 || path == NULL ||
        stat(path, &st) != 0) {
        return 0;
    }
    return st.st_ino == g_loaded.st_ino && st.st_dev == g_loaded.st_dev &&
           st.st_size == g_loaded.st_size && st.st_mtim.tv_sec == g_loaded.st_mtim.tv_sec &&
           st.st_mtim.tv_nsec == g_loaded.st_mtim.tv_nsec;
}

/* Where each GPU init found is in the current state: the GPU of the same UUID and binding,
 * or -1 (lost). */
static void locate(void)
{
    for (int b = 0; b < g_bound_count; b++) {
        g_where[b] = -1;
        for (int i = 0; i < g_state.ngpus; i++) {
            if (strcmp(g_state.gpus[i].uuid, g_bound_uuid[b]) == 0 &&
                g_state.gpus[i].binding == g_bound_binding[b]) {
                g_where[b] = i;
                break;
            }
        }
    }
}

/* Re-read $FAKE_NVML_STATE; on any problem the state becomes "every call fails". */
static void reload_state(void)
{
    const char *path = getenv("FAKE_NVML_STATE");
    FILE *f = NULL;
    char line[FAKE_LINE];
    int lineno = 0;

    init_handles();
    /* Noted before reading, so a write during the read shows as a change next time. */
    g_loaded_valid = path != NULL && path[0] != '\0' && stat(path, &g_loaded) == 0;
    memset(&g_next, 0, sizeof(g_next));
    if (path == NULL || path[0] == '\0' || (f = fopen(path, "r")) == NULL) {
        memset(&g_state, 0, sizeof(g_state));
        g_state.status = NVML_ERROR_DRIVER_NOT_LOADED;
        g_loaded_valid = 0;
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        size_t len = strlen(line);
        lineno++;
        if (len > 0 && line[len - 1] == '\n') {
            line[--len] = '\0';
        } else if (!feof(f)) {
            fprintf(stderr, "fake_nvml: %s:%d: line too long\n", path, lineno);
            g_next.status = NVML_ERROR_UNKNOWN;
            break;
        }
        if (parse_line(&g_next, line) != 0) {
            fprintf(stderr, "fake_nvml: %s:%d: cannot parse: %s\n", path, lineno, line);
            g_next.status = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    fclose(f);
    if (g_next.status != NVML_SUCCESS) {
        memset(&g_state, 0, sizeof(g_state));
        g_state.status = g_next.status;
        g_loaded_valid = 0;
        return;
    }
    memcpy(&g_state, &g_next, sizeof(g_state));
    locate();
}

/* ------------------------------------------------------------------ helpers */

static int handle_gpu(nvmlDevice_t h)
{
    uintptr_t p = (uintptr_t)h;
    uintptr_t base = (uintptr_t)&g_gpu_handles[0];
    uintptr_t end = (uintptr_t)&g_gpu_handles[FAKE_MAX_GPUS];
    if (p >= base && p < end && (p - base) % sizeof(g_gpu_handles[0]) == 0) {
        return 1;
    }
    base = (uintptr_t)&g_mig_handles[0][0];
    end = (uintptr_t)&g_mig_handles[FAKE_MAX_GPUS - 1][FAKE_MAX_MIGS];
    if (p >= base && p < end && (p - base) % sizeof(g_mig_handles[0][0]) == 0) {
        return 2;
    }
    return 0;
}

/* 1 when the GPU init found at `index` is gone: removed, or bound to the driver again. */
static int gpu_lost(int index)
{
    return g_where[index] < 0;
}

/* The index in the current state of the GPU a handle (checked, not lost) is bound to. */
static int at(nvmlDevice_t h)
{
    return g_where[h->gpu];
}

/* What a call through h answers before its own checks: INVALID_ARGUMENT for something that
 * is not a handle init gave out (or a MIG slot that is empty now), GPU_IS_LOST for the handle
 * of a GPU that left; SUCCESS for a handle to something that exists in the current state. */
static nvmlReturn_t handle_check(nvmlDevice_t h)
{
    int kind = handle_gpu(h);
    if (kind == 0 || h->gpu >= g_bound_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (gpu_lost(h->gpu)) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (kind == 2 &&
        (g_state.gpus[at(h)].mig != 1 || !g_state.migs[at(h)][h->slot].present)) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

static const struct fake_mig *handle_mig(nvmlDevice_t h)
{
    return h->slot < 0 ? NULL : &g_state.migs[at(h)][h->slot];
}

static int sel_matches_handle(const struct dev_sel *d, nvmlDevice_t h)
{
    if (d->all) {
        return 1;
    }
    if (h == NULL || d->gpu != at(h)) {
        return 0;
    }
    const struct fake_mig *m = handle_mig(h);
    if (m == NULL) {
        /* The full GPU handle answers for everything on that GPU, MIG instances included. */
        return 1;
    }
    return (d->gi < 0 || (unsigned int)d->gi == m->gi) &&
           (d->ci < 0 || (unsigned int)d->ci == m->ci) && d->gi >= 0;
}

/* A failure rule only hits a GPU handle when it names the whole GPU or "*". */
static int fail_matches_handle(const struct dev_sel *d, nvmlDevice_t h)
{
    if (d->all) {
        return 1;
    }
    if (h == NULL || d->gpu != at(h)) {
        return 0;
    }
    const struct fake_mig *m = handle_mig(h);
    if (m == NULL) {
        return d->gi < 0;
    }
    return (d->gi < 0 || (unsigned int)d->gi == m->gi) &&
           (d->ci < 0 || (unsigned int)d->ci == m->ci);
}

static nvmlReturn_t forced(const char *fn, nvmlDevice_t h)
{
    for (int i = 0; i < g_state.nfails; i++) {
        const struct fake_fail *f = &g_state.fails[i];
        if (strcmp(f->fn, fn) == 0 && fail_matches_handle(&f->dev, h)) {
            if (f->code == FAKE_HANG) {
                fake_log(fn, h, "hang");
                for (;;) {
                    pause();
                }
            }
            return f->code;
        }
    }
    return NVML_SUCCESS;
}

/* The checks every device call makes, in the order real NVML would fail them. */
static nvmlReturn_t enter(const char *fn, nvmlDevice_t h, int needs_handle)
{
    if (g_init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (g_state.status != NVML_SUCCESS) {
        return g_state.status;
    }
    if (needs_handle) {
        nvmlReturn_t rc = h == NULL ? NVML_ERROR_INVALID_ARGUMENT : handle_check(h);
        if (rc != NVML_SUCCESS) {
            return rc;
        }
    }
    return forced(fn, h);
}

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    if (dst == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (strlen(src) + 1 > length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    strcpy(dst, src);
    return NVML_SUCCESS;
}

#define ENTER(fn, h, needs)                         \
    do {                                            \
        nvmlReturn_t enter_rc_ = enter(fn, h, needs); \
        if (enter_rc_ != NVML_SUCCESS) {            \
            return enter_rc_;                       \
        }                                           \
    } while (0)

/* Lets tests tell this library from a real libnvidia-ml already loaded in the process. */
int fake_nvml_is_fake(void);
int fake_nvml_is_fake(void)
{
    return 1;
}

/* ------------------------------------------------------------------ init and system */

static nvmlReturn_t do_init(const char *fn)
{
    fake_log(fn, NULL, NULL);
    reload_state();
    nvmlReturn_t rc = forced(fn, NULL);
    if (rc != NVML_SUCCESS) {
        return rc;
    }
    if (g_state.status != NVML_SUCCESS) {
        return g_state.status;
    }
    if (g_init_count == 0) {
        /* Real NVML enumerates on the first init only; a nested one only counts. */
        g_bound_count = g_state.ngpus;
        for (int i = 0; i < g_state.ngpus; i++) {
            strcpy(g_bound_uuid[i], g_state.gpus[i].uuid);
            g_bound_binding[i] = g_state.gpus[i].binding;
        }
        locate();
    }
    g_init_count++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}

nvmlReturn_t nvmlInit_v2(void)
{
    return do_init("nvmlInit_v2");
}

nvmlReturn_t nvmlShutdown(void)
{
    fake_log("nvmlShutdown", NULL, NULL);
    if (g_init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    g_init_count--;
    return forced("nvmlShutdown", NULL);
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
        return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    fake_log("nvmlSystemGetDriverVersion", NULL, NULL);
    ENTER("nvmlSystemGetDriverVersion", NULL, 0);
    return copy_out(version, length, g_state.driver);
}

/* ------------------------------------------------------------------ devices */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    fake_log("nvmlDeviceGetCount_v2", NULL, NULL);
    if (g_init_count == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (!state_unchanged()) {
        reload_state();
    }
    ENTER("nvmlDeviceGetCount_v2", NULL, 0);
    if (deviceCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *deviceCount = (unsigned int)g_bound_count; /* what init found, not what the state says */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    fake_log("nvmlDeviceGetHandleByIndex_v2", NULL, "%u", index);
    ENTER("nvmlDeviceGetHandleByIndex_v2", NULL, 0);
    if (device == NULL || index >= (unsigned int)g_bound_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (gpu_lost((int)index)) {
        return NVML_ERROR_GPU_IS_LOST; /* as nvidia-smi shows a GPU that fell off the bus */
    }
    /* A forced failure for one GPU ("fail nvmlDeviceGetHandleByIndex_v2 1 15"). */
    nvmlReturn_t rc = forced("nvmlDeviceGetHandleByIndex_v2", &g_gpu_handles[index]);
    if (rc != NVML_SUCCESS) {
        return rc;
    }
    *device = &g_gpu_handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    fake_log("nvmlDeviceGetUUID", device, NULL);
    ENTER("nvmlDeviceGetUUID", device, 1);
    const struct fake_mig *m = handle_mig(device);
    return copy_out(uuid, length, m ? m->uuid : g_state.gpus[at(device)].uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    fake_log("nvmlDeviceGetName", device, NULL);
    ENTER("nvmlDeviceGetName", device, 1);
    const struct fake_mig *m = handle_mig(device);
    return copy_out(name, length, m ? m->name : g_state.gpus[at(device)].name);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    fake_log("nvmlDeviceGetIndex", device, NULL);
    ENTER("nvmlDeviceGetIndex", device, 1);
    if (index == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *index = (unsigned int)device->gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    fake_log("nvmlDeviceGetMigMode", device, NULL);
    ENTER("nvmlDeviceGetMigMode", device, 1);
    if (currentMode == NULL || pendingMode == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (handle_mig(device) != NULL || g_state.gpus[at(device)].mig < 0) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *currentMode = (unsigned int)g_state.gpus[at(device)].mig;
    *pendingMode = *currentMode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    fake_log("nvmlDeviceGetMaxMigDeviceCount", device, NULL);
    ENTER("nvmlDeviceGetMaxMigDeviceCount", device, 1);
    if (count == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (handle_mig(device) != NULL || g_state.gpus[at(device)].mig < 0) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *count = FAKE_MAX_MIGS;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice)
{
    fake_log("nvmlDeviceGetMigDeviceHandleByIndex", device, "%u", index);
    ENTER("nvmlDeviceGetMigDeviceHandleByIndex", device, 1);
    if (migDevice == NULL || handle_mig(device) != NULL || index >= FAKE_MAX_MIGS) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (g_state.gpus[at(device)].mig != 1) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    if (!g_state.migs[at(device)][index].present) {
        return NVML_ERROR_NOT_FOUND;
    }
    *migDevice = &g_mig_handles[device->gpu][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    fake_log("nvmlDeviceGetGpuInstanceId", device, NULL);
    ENTER("nvmlDeviceGetGpuInstanceId", device, 1);
    const struct fake_mig *m = handle_mig(device);
    if (id == NULL || m == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *id = m->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    fake_log("nvmlDeviceGetComputeInstanceId", device, NULL);
    ENTER("nvmlDeviceGetComputeInstanceId", device, 1);
    const struct fake_mig *m = handle_mig(device);
    if (id == NULL || m == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *id = m->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device)
{
    fake_log("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice, NULL);
    ENTER("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice, 1);
    if (device == NULL || handle_mig(migDevice) == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = &g_gpu_handles[migDevice->gpu];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    fake_log("nvmlDeviceGetMemoryInfo", device, NULL);
    ENTER("nvmlDeviceGetMemoryInfo", device, 1);
    if (memory == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned long long used = 0;
    for (int i = 0; i < g_state.nprocs; i++) {
        const struct fake_proc *p = &g_state.procs[i];
        if (p->mem != NVML_VALUE_NOT_AVAILABLE_ULL && sel_matches_handle(&p->dev, device)) {
            used += p->mem;
            if (used > FAKE_TOTAL_MEMORY) {
                used = FAKE_TOTAL_MEMORY;
            }
        }
    }
    memory->total = FAKE_TOTAL_MEMORY;
    memory->used = used;
    memory->free = FAKE_TOTAL_MEMORY - used;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ power */

/* Real NVML answers both for a full GPU only: a MIG device handle is NOT_SUPPORTED. */
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    fake_log("nvmlDeviceGetPowerUsage", device, NULL);
    ENTER("nvmlDeviceGetPowerUsage", device, 1);
    if (power == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    const struct fake_gpu *g = &g_state.gpus[at(device)];
    if (handle_mig(device) != NULL || !g->has_power) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *power = g->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    fake_log("nvmlDeviceGetTotalEnergyConsumption", device, NULL);
    ENTER("nvmlDeviceGetTotalEnergyConsumption", device, 1);
    if (energy == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    const struct fake_gpu *g = &g_state.gpus[at(device)];
    if (handle_mig(device) != NULL || !g->has_power) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *energy = g->energy_mj;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ processes */

static nvmlReturn_t list_processes(const char *fn, nvmlDevice_t device, unsigned int *count,
                                   void *infos, int version, int list)
{
    fake_log(fn, device, "%s %u", infos ? "fill" : "size", count ? *count : 0U);
    ENTER(fn, device, 1);
    if (count == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned int n = 0;
    for (int i = 0; i < g_state.nprocs; i++) {
        const struct fake_proc *p = &g_state.procs[i];
        if (p->list == list && sel_matches_handle(&p->dev, device)) {
            n++;
        }
    }
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (int i = 0; i < g_state.nprocs && k < n; i++) {
        const struct fake_proc *p = &g_state.procs[i];
        if (p->list != list || !sel_matches_handle(&p->dev, device)) {
            continue;
        }
        if (version == 1) {
            nvmlProcessInfo_v1_t *out = &((nvmlProcessInfo_v1_t *)infos)[k];
            out->pid = p->pid;
            out->usedGpuMemory = p->mem;
        } else {
            nvmlProcessInfo_v2_t *out = &((nvmlProcessInfo_v2_t *)infos)[k];
            out->pid = p->pid;
            out->usedGpuMemory = p->mem;
            out->gpuInstanceId =
                p->dev.gi < 0 ? NVML_VALUE_NOT_AVAILABLE_UINT : (unsigned int)p->dev.gi;
            out->computeInstanceId =
                p->dev.ci < 0 ? NVML_VALUE_NOT_AVAILABLE_UINT : (unsigned int)p->dev.ci;
        }
        k++;
    }
    *count = k;
    return NVML_SUCCESS;
}

#define PROCESS_FN(sym, type, version, list)                                    \
    nvmlReturn_t sym(nvmlDevice_t device, unsigned int *infoCount, type *infos); \
    nvmlReturn_t sym(nvmlDevice_t device, unsigned int *infoCount, type *infos)  \
    {                                                                           \
        return list_processes(#sym, device, infoCount, infos, version, list);   \
    }

#ifndef FAKE_NVML_NO_V1
PROCESS_FN(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 1, LIST_COMPUTE)
PROCESS_FN(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, 1, LIST_GRAPHICS)
PROCESS_FN(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, 1, LIST_MPS)
#endif
#ifndef FAKE_NVML_NO_V2
PROCESS_FN(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 2, LIST_COMPUTE)
PROCESS_FN(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, 2, LIST_GRAPHICS)
PROCESS_FN(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 2, LIST_MPS)
#endif
#ifndef FAKE_NVML_NO_V3
PROCESS_FN(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, 3, LIST_COMPUTE)
PROCESS_FN(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_v2_t, 3, LIST_GRAPHICS)
PROCESS_FN(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, 3, LIST_MPS)
#endif

/* ------------------------------------------------------------------ utilization */

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    fake_log("nvmlDeviceGetProcessUtilization", device, "%s %llu", utilization ? "fill" : "size",
             lastSeenTimeStamp);
    ENTER("nvmlDeviceGetProcessUtilization", device, 1);
    if (processSamplesCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned int n = 0;
    for (int i = 0; i < g_state.nsamples; i++) {
        const struct fake_sample *s = &g_state.samples[i];
        if (s->ts > lastSeenTimeStamp && sel_matches_handle(&s->dev, device)) {
            n++;
        }
    }
    if (n == 0) {
        return NVML_ERROR_NOT_FOUND;
    }
    if (utilization == NULL || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (int i = 0; i < g_state.nsamples && k < n; i++) {
        const struct fake_sample *s = &g_state.samples[i];
        if (s->ts <= lastSeenTimeStamp || !sel_matches_handle(&s->dev, device)) {
            continue;
        }
        utilization[k].pid = s->pid;
        utilization[k].timeStamp = s->ts;
        utilization[k].smUtil = s->sm;
        utilization[k].memUtil = s->mem;
        utilization[k].encUtil = 0;
        utilization[k].decUtil = 0;
        k++;
    }
    *processSamplesCount = k;
    return NVML_SUCCESS;
}
