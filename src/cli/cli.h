/* vramplan CLI: what the command files share. */
#ifndef VRAMPLAN_CLI_H
#define VRAMPLAN_CLI_H

/* A usage error: message, the pointer to --help; returns exit code 2. */
int cli_usage_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* vramplan validate FILE.jsonl... (argv[0] is "validate"). */
int cli_validate(int argc, char **argv);

#endif
