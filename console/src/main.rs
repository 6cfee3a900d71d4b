//! The `im-console` binary: parses the command line, resolves the settings, sets up the
//! terminal (`ratatui::try_init`, the fallible `init`, whose panic hook restores it) and
//! runs the app; `ratatui::restore` on the way out, whatever happened.

use anyhow::Context as _;
use clap::Parser as _;

use im_console::config::{self, Options};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    let settings =
        config::resolve(&opts, &|k| std::env::var(k).ok()).context("im-console: bad settings")?;
    // Reject unusable URLs before taking over the terminal.
    for u in &settings.urls {
        im_console::api::parse_base_url(u)?;
    }
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            return Err(e).context("im-console needs an interactive terminal");
        }
    };
    let result = im_console::app::run(&mut terminal, settings).await;
    ratatui::restore();
    result.context("im-console")
}
