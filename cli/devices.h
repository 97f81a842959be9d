/* `cdiffusers devices` (cli/devices.c). */
#ifndef CDF_CLI_DEVICES_H
#define CDF_CLI_DEVICES_H

int cdf_cli_devices(int argc, char **argv);

#endif
