//! The `tpslab` binary: the window (no subcommand) or the command line subcommands.

fn main() -> std::process::ExitCode {
    tpslab::cli::main()
}
