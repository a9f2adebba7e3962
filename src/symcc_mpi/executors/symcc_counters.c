/* Preloaded into a SymCC-built target by symcc-mpi: counts the symbolic branches the target
 * hands to SymCC's backend and those during which QSYM ran the solver, into a small file the
 * worker reads after the run (a run killed by its timeout leaves its counts there too).
 * A branch QSYM did not solve was pruned: its context was in the coverage map, or
 * linearization made its condition concrete. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define COUNTERS_MAGIC 0x73796d63634d5049ULL /* "symccMPI" */

struct counters {
    uint64_t magic;
    uint64_t branches;
    uint64_t solved_branches;
    uint64_t checks;
};

static struct counters unused;
static struct counters *counters = &unused;
static void (*real_push)(void *, int, uintptr_t);
static int (*real_check)(void *, void *);

__attribute__((constructor)) static void symcc_mpi_counters_init(void)
{
    real_push = (void (*)(void *, int, uintptr_t))dlsym(RTLD_NEXT, "_sym_push_path_constraint");
    real_check = (int (*)(void *, void *))dlsym(RTLD_NEXT, "Z3_solver_check");
    const char *path = getenv("SYMCC_MPI_COUNTERS");
    if (path == NULL || real_push == NULL || real_check == NULL)
        return;
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return;
    void *mapped = mmap(NULL, sizeof *counters, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED)
        return;
    counters = mapped;
    counters->magic = COUNTERS_MAGIC;
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
