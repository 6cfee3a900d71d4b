//! Selectable tables: the connections, slow-consumer, log-filter and profile views show a
//! table whose highlighted row follows the view's cursor. The look and the selection
//! rule (no row selected when the table is empty) live here once.

use ratatui::layout::{Constraint, Flex, Rect};
use ratatui::widgets::{Row, Table, TableState};
use ratatui::Frame;

use super::{block, selected_style};

/// A bordered table titled `title`, with the header row and the `▶` selection marker.
pub(crate) fn selectable<'a>(
    header: Row<'a>,
    body: impl IntoIterator<Item = Row<'a>>,
    widths: impl IntoIterator<Item = Constraint>,
    title: impl Into<String>,
) -> Table<'a> {
    Table::new(body, widths)
        .header(header)
        .row_highlight_style(selected_style())
        .highlight_symbol("▶ ")
        .flex(Flex::Start)
        .block(block(title))
}

/// Draws `table` into `area` with row `cursor` selected, or none when it has no rows.
pub(crate) fn render(
    frame: &mut Frame<'_>,
    table: Table<'_>,
    area: Rect,
    rows: usize,
    cursor: usize,
) {
    let mut ts = TableState::default().with_selected((rows > 0).then_some(cursor));
    frame.render_stateful_widget(table, area, &mut ts);
}
