/* Preloaded into a SymCC-built target by symcc-mpi (executors/symcc.py). Two jobs:
 *
 * 1. A forkserver. SymCC's runtime makes its Z3 context in _sym_initialize, before main and
 *    before it reads anything that belongs to one run (QSYM's coverage map, the input): on the
 *    bundled json parser that is ~10 ms of a ~19 ms pruned run (Z3 zeroes two 8 MB tables),
 *    after ~3 ms of exec and dynamic linking. With SYMCC_MPI_FORKSERVER="CONTROL,STATUS" (two
 *    inherited pipe descriptors), the first Z3_mk_context_rc does not return: it says hello
 *    on STATUS, then forks one child per 4-byte request read from CONTROL and answers with the
 *    child's pid, then its wait status. Each child returns from Z3_mk_context_rc and goes on
 *    as a fresh run would, in a process group of its own (a timeout kills the group), with
 *    stderr in SYMCC_MPI_STDERR and, when SYMCC_MPI_STDIN is set, stdin from that file.
 *    Everything a run reads from its environment (input path, output directory, map path) was
 *    fixed when the forkserver started: the executor starts one per such set.
 *
 * 2. Branch counters: the symbolic branches the target hands to SymCC's backend and those
 *    during which QSYM ran the solver, and the branch targets on the run's path, in the file
 *    SYMCC_MPI_COUNTERS (mapped shared, so a run killed by its timeout leaves what it recorded
 *    there too). A branch QSYM did not solve was pruned: its context was in the coverage map,
 *    or linearization made its condition concrete.
 *
 * A branch target is 1 + the index QSYM's AflTraceMap gives a branch in its context:
 * getIndex(hashPc(pc, taken)) (qsym/pintool/afl_trace_map.cpp). libsymcc-rt.so calls
 * AflTraceMap::isInterestingBranch and libz3's functions through its PLT, so the definitions
 * here come first; the branch index is computed as QSYM does, before the real call moves
 * QSYM's prev_loc_ on, and the target is marked solved when the real call says "interesting"
 * (QSYM then negates the branch). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define COUNTERS_MAGIC 0x73796d63634d5049ULL /* "symccMPI" */
#define FORKSERVER_HELLO 0x53464d53u          /* "SMFS" */
#define MAP_SIZE 65536                         /* QSYM's kMapSize */

/* The file's layout, read by symcc.py (_COUNTERS_HEADER and the offsets after it). */
struct counters {
    uint64_t magic;
    uint64_t branches;
    uint64_t solved_branches;
    uint64_t checks;
    uint64_t records_targets;          /* 1: QSYM's branch map is there, `path` is complete */
    uint64_t path_length;              /* entries used in `path` */
    uint8_t seen[MAP_SIZE / 8];        /* bit per index: already in `path` */
    uint8_t solved[MAP_SIZE / 8];      /* bit per index: QSYM negated it at least once */
    uint32_t path[MAP_SIZE];           /* targets (index + 1), in the order first met */
};

static struct counters unused;
static struct counters *counters = &unused;
static bool counting;
static void (*real_push)(void *, int, uintptr_t);
static int (*real_check)(void *, void *);
static void *(*real_mk_context_rc)(void *);
static bool (*real_is_interesting_branch)(void *, unsigned long, bool);
static unsigned long (*qsym_get_index)(void *, unsigned long);
static unsigned int (*xxh32)(const void *, size_t, unsigned int);

/* A run's counters start blank: the executor zeroes the header before each run, so a run in
 * which this never happens reads as "not counted". */
static void counters_begin_run(void)
{
    if (!counting)
        return;
    memset(counters, 0, offsetof(struct counters, path));
    counters->records_targets = real_is_interesting_branch != NULL &&
                                qsym_get_index != NULL && xxh32 != NULL;
    counters->magic = COUNTERS_MAGIC;
}

__attribute__((constructor)) static void symcc_mpi_preload_init(void)
{
    real_push = (void (*)(void *, int, uintptr_t))dlsym(RTLD_NEXT, "_sym_push_path_constraint");
    real_check = (int (*)(void *, void *))dlsym(RTLD_NEXT, "Z3_solver_check");
    real_mk_context_rc = (void *(*)(void *))dlsym(RTLD_NEXT, "Z3_mk_context_rc");
    real_is_interesting_branch = (bool (*)(void *, unsigned long, bool))dlsym(
        RTLD_NEXT, "_ZN4qsym11AflTraceMap19isInterestingBranchEmb");
    qsym_get_index = (unsigned long (*)(void *, unsigned long))dlsym(
        RTLD_NEXT, "_ZN4qsym11AflTraceMap8getIndexEm");
    xxh32 = (unsigned int (*)(const void *, size_t, unsigned int))dlsym(RTLD_NEXT, "XXH32");
    const char *path = getenv("SYMCC_MPI_COUNTERS");
    if (path == NULL || real_push == NULL || real_check == NULL)
        return;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return;
    void *mapped = MAP_FAILED;
    if (lseek(fd, 0, SEEK_END) >= (off_t)sizeof *counters)
        mapped = mmap(NULL, sizeof *counters, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED)
        return;
    counters = mapped;
    counting = true;
    counters_begin_run();
}

/* ---------------------------------------------------------------------------- forkserver */

static bool write_word(int fd, uint32_t word)
{
    return write(fd, &word, sizeof word) == sizeof word;
}

/* `name`'s file on descriptor `target`; false if it cannot be opened. */
static bool redirect(const char *name, int flags, int target)
{
    const char *path = getenv(name);
    if (path == NULL)
        return true;
    int fd = open(path, flags, 0600);
    if (fd < 0)
        return false;
    if (fd != target) {
        dup2(fd, target);
        close(fd);
    }
    return true;
}

/* Returns only in a child, ready to run. */
static void serve(int control, int status)
{
    if (!write_word(status, FORKSERVER_HELLO))
        _exit(0);
    for (;;) {
        uint32_t request;
        if (read(control, &request, sizeof request) != sizeof request)
            _exit(0); /* the executor is gone or stopped us */
        pid_t child = fork();
        if (child == 0) {
            close(control);
            close(status);
            setpgid(0, 0);
            unsetenv("SYMCC_MPI_FORKSERVER"); /* a program the target starts is no server */
            if (!redirect("SYMCC_MPI_STDERR", O_WRONLY | O_CREAT | O_TRUNC, STDERR_FILENO) ||
                !redirect("SYMCC_MPI_STDIN", O_RDONLY, STDIN_FILENO))
                _exit(125);
            counters_begin_run();
            return;
        }
        if (!write_word(status, child < 0 ? 0 : (uint32_t)child))
            _exit(0);
        if (child < 0)
            continue; /* the executor reads pid 0 as "fork failed" */
        int wait_status;
        while (waitpid(child, &wait_status, 0) < 0) {
            if (errno != EINTR)
                _exit(1);
        }
        if (!write_word(status, (uint32_t)wait_status))
            _exit(0);
    }
}

void *Z3_mk_context_rc(void *config)
{
    static bool served;
    void *context = real_mk_context_rc(config);
    const char *fds = getenv("SYMCC_MPI_FORKSERVER");
    int control, status;
    if (served || fds == NULL || sscanf(fds, "%d,%d", &control, &status) != 2)
        return context;
    served = true;
    serve(control, status);
    return context;
}

/* ------------------------------------------------------------------------------ counters */

void _sym_push_path_constraint(void *constraint, int taken, uintptr_t site_id)
{
    if (constraint == NULL) { /* a concrete condition: never a query */
        real_push(constraint, taken, site_id);
        return;
    }
    uint64_t checks_before = counters->checks;
    counters->branches++;
    real_push(constraint, taken, site_id);
    if (counters->checks != checks_before)
        counters->solved_branches++;
}

int Z3_solver_check(void *context, void *solver)
{
    counters->checks++;
    return real_check(context, solver);
}

/* QSYM's hashPc: XXH32 of the pc's 8 bytes then the bool's byte, seed 0, modulo the map. */
static unsigned long hash_pc(unsigned long pc, bool taken)
{
    unsigned char key[sizeof pc + sizeof taken];
    memcpy(key, &pc, sizeof pc);
    memcpy(key + sizeof pc, &taken, sizeof taken);
    return xxh32(key, sizeof key, 0) % MAP_SIZE;
}

bool _ZN4qsym11AflTraceMap19isInterestingBranchEmb(void *map, unsigned long pc, bool taken)
{
    if (!counters->records_targets)
        return real_is_interesting_branch(map, pc, taken);
    unsigned long index = qsym_get_index(map, hash_pc(pc, taken)) % MAP_SIZE;
    uint8_t bit = (uint8_t)(1u << (index % 8));
    if (!(counters->seen[index / 8] & bit)) {
        counters->seen[index / 8] |= bit;
        counters->path[counters->path_length] = (uint32_t)index + 1;
        counters->path_length++; /* after the entry: a kill in between loses only that one */
    }
    bool interesting = real_is_interesting_branch(map, pc, taken);
    if (interesting)
        counters->solved[index / 8] |= bit;
    return interesting;
}
