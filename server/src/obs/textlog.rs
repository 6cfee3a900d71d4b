//! The human text log's field formatting: every field value and the message pass through
//! [`Escaper`], so client-supplied text (ids, reasons) cannot break a line or forge one,
//! nor send terminal escapes. `\n`, `\r`, `\t` become `\n`, `\r`, `\t` written with a
//! backslash; other control characters (C0, DEL, C1) and the Unicode line and paragraph
//! separators become `\u{..}`. Ordinary text is written as is, without allocating.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// A `fmt::Write` that escapes control characters on their way to `inner`.
pub struct Escaper<W>(pub W);

/// Whether `c` is written escaped.
fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

impl<W: Write> Write for Escaper<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, c) in s.char_indices() {
            if !needs_escape(c) {
                continue;
            }
            self.0.write_str(&s[start..i])?;
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                c => write!(self.0, "\\u{{{:x}}}", c as u32)?,
            }
            start = i + c.len_utf8();
        }
        self.0.write_str(&s[start..])
    }
}

/// The text log's [`FormatFields`]: the message first, then `name=value` pairs, as the
/// default formatter lays them out, with every value escaped.
#[derive(Debug, Default, Clone, Copy)]
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut v = EscapedVisitor {
            ansi: writer.has_ansi_escapes(),
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut v);
        v.result
    }
}

/// Writes one event's or span's fields through [`Escaper`].
struct EscapedVisitor<'a> {
    writer: Writer<'a>,
    ansi: bool,
    first: bool,
    result: fmt::Result,
}

impl EscapedVisitor<'_> {
    /// Writes the separator and `name=` (nothing before the message).
    fn prefix(&mut self, name: &str) -> fmt::Result {
        if !self.first {
            self.writer.write_char(' ')?;
        }
        self.first = false;
        if name == "message" {
            return Ok(());
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        if self.ansi {
            write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")
        } else {
            write!(self.writer, "{name}=")
        }
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record_debug(field, &format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        self.result = self
            .prefix(field.name())
            .and_then(|()| write!(Escaper(&mut self.writer), "{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc(s: &str) -> String {
        let mut out = String::new();
        Escaper(&mut out).write_str(s).unwrap();
        out
    }

    #[test]
    fn escaper_escapes_controls_and_keeps_ordinary_text() {
        assert_eq!(esc("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
        assert_eq!(esc("d\n{\"level\":\"ERROR\"}"), "d\\n{\"level\":\"ERROR\"}");
        assert_eq!(esc("a\rb\tc"), "a\\rb\\tc");
        assert_eq!(esc("\x1b[31mred"), "\\u{1b}[31mred");
        assert_eq!(esc("\0\x7f\u{85}\u{2028}"), "\\u{0}\\u{7f}\\u{85}\\u{2028}");
        assert_eq!(esc(""), "");
    }

    #[test]
    fn text_fields_are_escaped_in_message_and_values() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt;

        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let sink = buf.clone();
        let sub = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(EscapedFields)
                .with_ansi(false)
                .with_writer(move || sink.clone()),
        );
        tracing::subscriber::with_default(sub, || {
            let dev = "d\n{\"forged\":true}";
            tracing::info!(device = %dev, id = ?dev, n = 3, "hi\nthere");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(
            out.contains(r#"hi\nthere device=d\n{"forged":true} id="d\n{\"forged\":true}" n=3"#),
            "{out}"
        );
    }
}
