//! The `tpslab` binary: the command line (and, later, the window).

fn main() -> std::process::ExitCode {
    tpslab::cli::main()
}
