//! Actions: what a key press asks the console to do, named apart from the key that
//! asked. [`crate::input`] makes them; [`crate::state`]'s reducer applies them.

use crate::screen::View;

/// What a key asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Leave the console.
    Quit,
    /// Show or hide the help overlay.
    ToggleHelp,
    /// Next view (tab).
    NextView,
    /// Previous view (shift-tab).
    PrevView,
    /// Go to a view (number keys).
    GoView(View),
    /// Next node.
    NextNode,
    /// Previous node.
    PrevNode,
    /// Open the node picker.
    NodePicker,
    /// Pick node N (0-based) in the node picker.
    PickNode(usize),
    /// Row up.
    Up,
    /// Row down.
    Down,
    /// Page up.
    PageUp,
    /// Page down.
    PageDown,
    /// First row.
    Top,
    /// Last row.
    Bottom,
    /// Start typing a filter.
    StartFilter,
    /// Next sort column.
    Sort,
    /// Reverse the sort.
    ReverseSort,
    /// `t`: toggle the latency scale (log/linear), or the Profile view's CPU / heap.
    ToggleScale,
    /// Poll now.
    Refresh,
    /// Kick the selected connection / remove the selected log filter.
    Delete,
    /// Add a log filter / start a capture.
    Add,
    /// Revoke the selected connection's user (Connections views).
    Revoke,
    /// Set the node's global log level (Logs view).
    GlobalLevel,
    /// Yes (confirmation).
    Confirm,
    /// Enter: submit a form or filter, pick a node.
    Submit,
    /// Escape: cancel, clear the filter, close a popup.
    Cancel,
    /// A typed character.
    Char(char),
    /// Delete the last typed character.
    Backspace,
    /// Next form field.
    NextField,
    /// Previous form field.
    PrevField,
    /// Left (choice fields).
    Left,
    /// Right (choice fields).
    Right,
    /// Announce a SYSTEM message to a group (any view).
    Announce,
    /// Start the live tail of the selected filter's user, or stop the open one (Logs view).
    Tail,
    /// `m`: open the Trace view on the selected tail line's message (Logs view).
    TraceMessage,
    /// `e`: queue the selected endpoint's parked events again (Webhooks view).
    Redeliver,
}
