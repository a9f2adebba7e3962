/* Preloaded into a SymCC-built target by symcc-mpi: counts the symbolic branches the target
 * hands to SymCC's backend and those during which QSYM ran the solver, and records the branch
 * targets on the run's path, into a small file the worker reads after the run (a run killed by
 * its timeout leaves what it recorded there too).
 * A branch QSYM did not solve was pruned: its context was in the coverage map, or
 * linearization made its condition concrete.
 *
 * A branch target is 1 + the index QSYM's AflTraceMap gives a branch in its context:
 * getIndex(hashPc(pc, taken)) (qsym/pintool/afl_trace_map.cpp). libsymcc-rt.so calls
 * AflTraceMap::isInterestingBranch through its PLT, so the definition here comes first; it
 * computes the index as QSYM does, before the real call moves QSYM's prev_loc_ on, and marks
 * the target solved when the real call says "interesting" (QSYM then negates the branch). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define COUNTERS_MAGIC 0x73796d63634d5049ULL /* "symccMPI" */
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
static void (*real_push)(void *, int, uintptr_t);
static int (*real_check)(void *, void *);
static bool (*real_is_interesting_branch)(void *, unsigned long, bool);
static unsigned long (*qsym_get_index)(void *, unsigned long);
static unsigned int (*xxh32)(const void *, size_t, unsigned int);

__attribute__((constructor)) static void symcc_mpi_counters_init(void)
{
    real_push = (void (*)(void *, int, uintptr_t))dlsym(RTLD_NEXT, "_sym_push_path_constraint");
    real_check = (int (*)(void *, void *))dlsym(RTLD_NEXT, "Z3_solver_check");
    real_is_interesting_branch = (bool (*)(void *, unsigned long, bool))dlsym(
        RTLD_NEXT, "_ZN4qsym11AflTraceMap19isInterestingBranchEmb");
    qsym_get_index = (unsigned long (*)(void *, unsigned long))dlsym(
        RTLD_NEXT, "_ZN4qsym11AflTraceMap8getIndexEm");
    xxh32 = (unsigned int (*)(const void *, size_t, unsigned int))dlsym(RTLD_NEXT, "XXH32");
    const char *path = getenv("SYMCC_MPI_COUNTERS");
    if (path == NULL || real_push == NULL || real_check == NULL)
        return;
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return;
    void *mapped = MAP_FAILED;
    if (lseek(fd, 0, SEEK_END) >= (off_t)sizeof *counters)
        mapped = mmap(NULL, sizeof *counters, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED)
        return;
    counters = mapped;
    counters->magic = COUNTERS_MAGIC;
    counters->records_targets = real_is_interesting_branch != NULL &&
                                qsym_get_index != NULL && xxh32 != NULL;
}

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
