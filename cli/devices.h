/* `cdiffusers devices` and `cdiffusers cache` (cli/devices.c). */
#ifndef CDF_CLI_DEVICES_H
#define CDF_CLI_DEVICES_H

int cdf_cli_devices(int argc, char **argv);
/* `cdiffusers cache list|clear`: the pjrt backend's compiled programs on disk */
int cdf_cli_cache(int argc, char **argv);

#endif
