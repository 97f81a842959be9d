/* `cdiffusers convert` (cli/convert.c): one component's weights written as a GGUF file. */
#ifndef CDF_CLI_CONVERT_H
#define CDF_CLI_CONVERT_H

/* `cdiffusers convert ...` (argv[0] is the command); returns the exit code (0, 1 failure, 2 usage). */
int cdf_cli_convert(int argc, char **argv);

#endif
