/* vramplan: the command-line front end.
 *
 * A thin layer over libvramplan: the command table and main. Each group of
 * commands has its own file; they share one option parser (args.c), one
 * error printer and exit-code table (report.c) and one JSON writer
 * (json.c), declared in cli.h.
 *
 *   vramplan estimate models/gpt2-small.yaml --batch 8 --precision amp-bf16
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct command {
    const char *name;
    const char *usage;   /* arguments, for the command list               */
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command's name   */
} command;

/* A new command is a cli_<name>(argc, argv) in its group's file (options
 * through cli_args_parse, errors through cli_report, a cli_exit status)
 * and one line here; --help and dispatch pick it up. */
static const command commands[] = {
    {"estimate", "MODEL [OPTIONS]",
     "simulate training steps and report peak GPU memory", cli_estimate},
    {"maxbatch", "MODEL --budget SIZE",
     "the largest micro-batch that fits in a memory budget", cli_maxbatch},
    {"plan", "MODEL --gpu NAME",
     "search the fastest training setup that fits", cli_plan},
    {"techniques", "MODEL --budget SIZE",
     "what each memory technique buys on a model", cli_techniques},
    {"compare", "MODEL --gpus N,N... --gpu NAME,...",
     "the best cluster plan per cluster size and GPU", cli_compare},
    {"export", "MODEL --gpus N --gpu NAME --to FMT",
     "write a cluster plan as a DeepSpeed, Megatron-LM or torchrun config",
     cli_export},
    {"probe", "[OPTIONS] -- CMD ARGS...",
     "find the largest batch by running the real command", cli_probe},
    {"watch", "[OPTIONS] -- CMD ARGS...",
     "follow a training job's GPU memory against the plan (NVML)",
     cli_watch},
    {"replay", "MODEL --budget SIZE",
     "replay the simulated step's segments and GEMMs on a real GPU",
     cli_replay},
    {"calibrate", "[OPTIONS]",
     "measure this GPU and write a GPU profile", cli_calibrate},
    {"fit", "FILE.jsonl... [OPTIONS]",
     "fit framework constants to measured runs", cli_fit},
    {"validate", "FILE.jsonl... [OPTIONS]",
     "compare the simulator with measured PyTorch runs", cli_validate},
    {"serve", "MODEL --gpu NAME", "size a vLLM server: KV blocks, "
     "concurrency", cli_serve},
    {"batching", "MODEL --lengths FILE --gpu NAME",
     "tokens per batch and batch per length bucket, padded or packed",
     cli_batching},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void main_help(FILE *f)
{
    fputs("Usage: vramplan COMMAND [ARGS]\n"
          "       vramplan --help | --version\n"
          "\n"
          "vramplan estimates the GPU memory that a PyTorch training step "
          "needs,\n"
          "by simulating its allocations through a model of the CUDA caching\n"
          "allocator.\n"
          "\n"
          "Commands:\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        char left[96];
        snprintf(left, sizeof left, "%s %s", commands[i].name,
                 commands[i].usage);
        if (strlen(left) > 30)
            fprintf(f, "  %s\n  %-30s %s\n", left, "", commands[i].summary);
        else
            fprintf(f, "  %-30s %s\n", left, commands[i].summary);
    }
    fputs("\n"
          "Options:\n"
          "  -h, --help       show this help and exit\n"
          "  -V, --version    show the version and exit\n"
          "\n"
          "Run 'vramplan COMMAND --help' for the options of a command.\n"
          "\n", f);
    cli_exit_help(f);
}

/* The command `name`, or NULL after a usage error (with a "did you
 * mean"). */
static const command *find_command(const char *name)
{
    const char *names[N_COMMANDS + 1];

    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
        names[i] = commands[i].name;
    }
    names[N_COMMANDS] = NULL;
    const char *best = vp_suggest(name, names);
    if (best != NULL)
        cli_usage_error("unknown command '%s' (did you mean '%s'?)", name,
                        best);
    else
        cli_usage_error("unknown command '%s'", name);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : NULL;
    const command *cmd;
    int rc;

    if (name == NULL)
        return cli_usage_error("no command given");
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
        main_help(stdout);
        rc = CLI_OK;
    } else if (strcmp(name, "-V") == 0 || strcmp(name, "--version") == 0) {
        printf("vramplan %s\n", VRAMPLAN_VERSION);
        rc = CLI_OK;
    } else if (name[0] == '-') {
        return cli_usage_error("unknown option '%s'", name);
    } else if ((cmd = find_command(name)) == NULL) {
        return CLI_USAGE;
    } else {
        /* probe and watch print their own running lines */
        bool quiet = cmd->run == cli_probe || cmd->run == cli_watch;
        if (!quiet)
            cli_progress_begin(name);
        rc = cmd->run(argc - 1, argv + 1);
        cli_progress_end();
    }
    if (fflush(stdout) != 0 || ferror(stdout))
        return cli_fail("cannot write the output: %s", strerror(errno));
    return rc;
}
