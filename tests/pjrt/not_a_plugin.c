/* A shared library that is not a PJRT plugin (no GetPjrtApi): test_pjrt loads it as one. */
int cdf_test_not_a_plugin(void) { return 42; }
