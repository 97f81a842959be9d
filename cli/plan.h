/* The CLI's memory commands (cli/plan.c): `cdiffusers plan` and generate's --offload /
 * --memory-stats helpers. */
#ifndef CDF_CLI_PLAN_H
#define CDF_CLI_PLAN_H

#include "cdiffusers/pipeline.h"

/* `cdiffusers plan ...` (argv[0] is the program); returns the exit code. */
int cdf_cli_plan(int argc, char **argv);
/* The measured per-phase device peaks of the last generate, to stderr. */
void cdf_cli_print_memory_stats(const cdf_pipeline *p);

#endif
