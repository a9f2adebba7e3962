/* master_capacity.py's sleep target: sleeps SLEEPER_SECONDS (default 0.25) and exits, reading
   nothing and generating nothing, so that a run costs its worker little CPU besides the
   process it is. */
#include <stdlib.h>
#include <time.h>

int main(void) {
    const char *text = getenv("SLEEPER_SECONDS");
    double seconds = text ? atof(text) : 0.25;
    struct timespec pause = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&pause, NULL);
    return 0;
}
