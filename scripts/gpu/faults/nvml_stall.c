/*
 * nvml_stall: a libnvidia-ml.so.1 stand-in that forwards every NVML call to the real
 * library and stalls one of them, to show that a hung driver call does not freeze
 * vramtop's screen (scripts/gpu/faults.sh, case "hung driver call").
 *
 * Build (x86-64 Linux, any C compiler):
 *   cc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o nvml_stall.so nvml_stall.c -ldl
 *
 * Why LD_PRELOAD works although vramtop never links NVML: nvml-wrapper loads NVML with
 * dlopen("libnvidia-ml.so.1") and resolves each function with dlsym on that handle, so
 * ordinary symbol interposition would not reach those calls. But glibc's dlopen first
 * looks among the objects already loaded, and an object whose DT_SONAME equals the
 * requested name is returned as that library. This file is linked with
 * -soname libnvidia-ml.so.1, so once it is preloaded, nvml-wrapper's dlopen returns it and
 * every dlsym lands on the functions below. (Putting it in a folder named first in
 * LD_LIBRARY_PATH, as libnvidia-ml.so.1, works too.) It opens the real library by its
 * absolute path, which glibc loads as a separate object.
 *
 * Environment:
 *   NVML_STALL_REAL     absolute path of the real libnvidia-ml.so.1 (default: the usual
 *                       library folders)
 *   NVML_STALL_AFTER    calls of nvmlDeviceGetMemoryInfo_v2 answered normally before the
 *                       stalled one (default 20)
 *   NVML_STALL_SECONDS  how long that one call sleeps before answering (default 10)
 *   NVML_STALL_MARK     a file to which "stall begin" and "stall end" lines are appended
 *                       with CLOCK_REALTIME stamps, so a script can line up its screens
 *
 * Every other function is a trampoline that jumps to the real one with the caller's
 * registers untouched, so no signatures are needed (nvml_symbols.h lists the names).
 * A function the real library lacks answers NVML_ERROR_FUNCTION_NOT_FOUND, as NVML does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__)
#error "nvml_stall.c has x86-64 trampolines only"
#endif

#define NVML_SUCCESS 0
#define NVML_ERROR_LIBRARY_NOT_FOUND 12

/* The real function behind each name: read by its trampoline, filled once by the
 * constructor before any NVML call. */
#define X(name) __attribute__((visibility("hidden"))) void *real_##name;
#include "nvml_symbols.h"
#undef X

static struct {
    const char *name;
    void **slot;
} const forwarded[] = {
#define X(name) {#name, &real_##name},
#include "nvml_symbols.h"
#undef X
};

typedef int (*memory_info_fn)(void *device, void *memory);
static memory_info_fn real_memory_info_v2;
static long stall_after = 20;
static unsigned stall_seconds = 10;
static long memory_info_calls;

static const char *const default_paths[] = {
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/lib/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
};

static void mark(const char *what) {
    const char *path = getenv("NVML_STALL_MARK");
    if (!path)
        return;
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fprintf(f, "%s %ld.%03ld\n", what, (long)now.tv_sec, now.tv_nsec / 1000000);
    fclose(f);
}

__attribute__((constructor)) static void nvml_stall_init(void) {
    const char *want = getenv("NVML_STALL_REAL");
    void *real = NULL;
    if (want) {
        real = dlopen(want, RTLD_NOW | RTLD_LOCAL);
    } else {
        for (size_t i = 0; !real && i < sizeof default_paths / sizeof *default_paths; i++)
            real = dlopen(default_paths[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (!real) {
        fprintf(stderr, "nvml_stall: cannot open the real libnvidia-ml.so.1 (%s); set NVML_STALL_REAL to its absolute path\n",
                want ? dlerror() : "not in the usual folders");
        return;
    }
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
        *forwarded[i].slot = dlsym(real, forwarded[i].name);
    real_memory_info_v2 = (memory_info_fn)dlsym(real, "nvmlDeviceGetMemoryInfo_v2");
    const char *after = getenv("NVML_STALL_AFTER");
    const char *seconds = getenv("NVML_STALL_SECONDS");
    if (after)
        stall_after = atol(after);
    if (seconds)
        stall_seconds = (unsigned)atoi(seconds);
}

/* The stalled call. vramtop polls every device from one thread, so a plain counter is
 * enough; __atomic keeps it right if another caller appears. */
int nvmlDeviceGetMemoryInfo_v2(void *device, void *memory) {
    if (!real_memory_info_v2)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    long n = __atomic_add_fetch(&memory_info_calls, 1, __ATOMIC_RELAXED);
    if (n == stall_after + 1) {
        mark("stall begin");
        unsigned left = stall_seconds;
        while (left > 0)
            left = sleep(left);
        mark("stall end");
    }
    return real_memory_info_v2(device, memory);
}

/* One exported trampoline per name: jump to the real function with every argument
 * register as the caller left it, or answer 13 (NVML_ERROR_FUNCTION_NOT_FOUND). */
#define X(name)                                                              \
    __asm__(".text\n"                                                        \
            ".globl " #name "\n"                                             \
            ".type " #name ", @function\n" #name ":\n"                       \
            "    movq real_" #name "(%rip), %rax\n"                          \
            "    testq %rax, %rax\n"                                         \
            "    jz 1f\n"                                                    \
            "    jmp *%rax\n"                                                \
            "1:  movl $13, %eax\n"                                           \
            "    ret\n"                                                      \
            ".size " #name ", .-" #name "\n");
#include "nvml_symbols.h"
#undef X
