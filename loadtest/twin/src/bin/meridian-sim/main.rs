//! The engine twin's command line: serve it, run an experiment in virtual time, replay a
//! recorded load test, or fit its cost model to a real engine. `cli` says what each
//! subcommand accepts, `commands` what it does (`calibrate` on its own).

mod calibrate;
mod cli;
mod commands;

use clap::Parser;

use cli::{Cli, Command};

#[tokio::main]
async fn main() -> Result<(), String> {
    match Cli::parse().command {
        Command::Serve(args) => commands::serve(args).await,
        Command::Run(args) => commands::run(args),
        Command::Conversations(args) => commands::conversations(args),
        Command::TraceHits(args) => commands::trace_hits(args),
        Command::Ab(args) => commands::ab(args),
        Command::Migration(args) => commands::migration(args),
        Command::Calibrate(args) => calibrate::calibrate(args),
        Command::Replay(args) => commands::replay(args),
        Command::Plot(args) => commands::plot(args),
    }
}
