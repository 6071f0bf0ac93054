//! The `tpslab` binary: the window (no subcommand) or the command line subcommands.

fn main() -> std::process::ExitCode {
    // First, while the process is small and has one thread: chat templates then render in
    // children of this small server, not in forks of a process that holds a model.
    tpslab_engine::text::chat::start_render_server();
    tpslab::cli::main()
}
