//! Trace access for every command: one [`Visitor`] interface over a
//! memory-mapped file (`MmapTrace`) or a single pass over a stream
//! (`StreamReader`, used for standard input given as `-`).
//!
//! A visit calls, in stream order: [`Visitor::meta`] once, then
//! [`Visitor::tensor`] for each host tensor data chunk and
//! [`Visitor::record`] for each record, then [`Visitor::end`] with the
//! verification spec and footer. Strings (component and op names) are
//! always defined before the records that use them.
//!
//! Either source is validated in full, also when a visitor stops early
//! ([`Flow::Stop`]): a file's stream digest is checked when it is opened,
//! and a stream is read to its trailer (without decoding further records),
//! so a corrupt or truncated trace is always an error.

use std::fmt;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use kb_format::{
    Event, Footer, FormatError, Meta, MmapTrace, Record, StreamReader, Strings, VerifySpec,
};

use crate::{Error, Result};

/// Where a trace comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A trace file, memory-mapped.
    Path(PathBuf),
    /// Standard input, read in one pass.
    Stdin,
}

impl Input {
    /// `-` is standard input; anything else is a path.
    pub fn parse(s: &str) -> Input {
        if s == "-" {
            Input::Stdin
        } else {
            Input::Path(PathBuf::from(s))
        }
    }

    pub fn is_stdin(&self) -> bool {
        matches!(self, Input::Stdin)
    }
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Input::Path(p) => write!(f, "{}", p.display()),
            Input::Stdin => f.write_str("<stdin>"),
        }
    }
}

impl From<&str> for Input {
    fn from(s: &str) -> Input {
        Input::parse(s)
    }
}

/// Whether a visit goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Deliver no more tensors or records (the trace is still validated).
    Stop,
}

/// What is known once the whole trace has been read.
pub struct End<'a> {
    pub meta: &'a Meta,
    /// The complete string table.
    pub strings: &'a Strings,
    pub verify: &'a VerifySpec,
    pub footer: &'a Footer,
    /// The host program's kernel launches (empty for a trace without any).
    pub launches: &'a [kb_format::Launch],
    /// What each HBM pseudo channel served: [`End::channels`].
    channels: &'a dyn Fn() -> Result<&'a [kb_format::ChannelUsage]>,
    /// False when the visitor stopped early.
    pub complete: bool,
}

impl End<'_> {
    /// What each HBM pseudo channel served (empty without a channels
    /// chunk), built when first asked for: a long run's chunk holds
    /// millions of intervals that most passes never read.
    pub fn channels(&self) -> Result<&[kb_format::ChannelUsage]> {
        (self.channels)()
    }
}

impl std::fmt::Debug for End<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("End")
            .field("meta", &self.meta)
            .field("footer", &self.footer)
            .field("launches", &self.launches)
            .field("complete", &self.complete)
            .finish_non_exhaustive()
    }
}

/// A pass over a trace. Only `record` is required.
pub trait Visitor {
    /// False when the visitor needs no records: records chunks are then
    /// checksummed but not decoded.
    fn wants_records(&self) -> bool {
        true
    }

    fn meta(&mut self, _meta: &Meta) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    /// The trace's launches, before any record, when they are known up
    /// front: for a file (its footer is read first), not for a stream,
    /// whose launches come with [`Visitor::end`].
    fn launches(&mut self, _launches: &[kb_format::Launch]) -> Result<()> {
        Ok(())
    }

    /// Host-provided bytes of tensor `tensor` (index into `Meta::tensors`)
    /// starting at byte `offset`.
    fn tensor(&mut self, _tensor: u32, _offset: u64, _data: &[u8]) -> Result<Flow> {
        Ok(Flow::Continue)
    }

    /// One record, in (t_start, op_id) order; `strings` defines every id it uses.
    fn record(&mut self, r: &Record, strings: &Strings) -> Result<Flow>;

    fn end(&mut self, _end: &End<'_>) -> Result<()> {
        Ok(())
    }
}

/// Visit `input` (a file or standard input).
pub fn visit<V: Visitor>(input: &Input, v: &mut V) -> Result<()> {
    let name = input.to_string();
    match input {
        // A pipe or device has no length to map: read it as a stream.
        Input::Path(p) if std::fs::metadata(p).is_ok_and(|m| !m.is_file()) => {
            let f = std::fs::File::open(p).map_err(|e| trace_err(&name)(FormatError::from(e)))?;
            visit_reader(&name, f, v)
        }
        Input::Path(p) => visit_file(&name, p, v),
        Input::Stdin => visit_reader(&name, io::stdin().lock(), v),
    }
}

fn trace_err(name: &str) -> impl Fn(FormatError) -> Error + '_ {
    move |source| Error::Trace {
        input: name.to_string(),
        source,
    }
}

/// Visit a trace file through a memory map.
pub fn visit_file<V: Visitor>(name: &str, path: &Path, v: &mut V) -> Result<()> {
    let te = trace_err(name);
    let m = MmapTrace::open(path).map_err(&te)?;
    m.verify_digest().map_err(&te)?;
    let mut stopped = v.meta(m.meta())? == Flow::Stop;
    v.launches(m.launches())?;
    let mut failed: Option<Error> = None;
    let mut rec = Record::default();
    m.for_each_event(|ev| {
        if stopped {
            return Ok(());
        }
        let flow = match ev {
            Event::Tensor {
                tensor,
                offset,
                data,
            } => v.tensor(tensor, offset, data),
            Event::Snapshot { .. } => Ok(Flow::Continue),
            Event::Records(_) if !v.wants_records() => Ok(Flow::Continue),
            Event::Records(mut c) => {
                let mut flow = Ok(Flow::Continue);
                while c.next_into(&mut rec)? {
                    flow = v.record(&rec, c.strings());
                    if !matches!(flow, Ok(Flow::Continue)) {
                        break;
                    }
                }
                flow
            }
        };
        match flow {
            Ok(Flow::Continue) => {}
            Ok(Flow::Stop) => stopped = true,
            Err(e) => {
                failed = Some(e);
                stopped = true;
            }
        }
        Ok(())
    })
    .map_err(&te)?;
    if let Some(e) = failed {
        return Err(e);
    }
    let channels = || m.channels().map_err(&te);
    v.end(&End {
        meta: m.meta(),
        strings: m.strings(),
        verify: m.verify_spec(),
        footer: m.footer(),
        launches: m.launches(),
        channels: &channels,
        complete: !stopped,
    })
}

/// Visit a trace read sequentially from `r` (one pass, bounded memory).
pub fn visit_reader<R: Read, V: Visitor>(name: &str, r: R, v: &mut V) -> Result<()> {
    let te = trace_err(name);
    let mut s = StreamReader::open(BufReader::with_capacity(256 << 10, r)).map_err(&te)?;
    let mut stopped = v.meta(s.meta())? == Flow::Stop;
    let mut rec = Record::default();
    while let Some(ev) = s.next_event().map_err(&te)? {
        if stopped {
            continue; // drain: chunks are still checksummed, the footer checked
        }
        let flow = match ev {
            Event::Tensor {
                tensor,
                offset,
                data,
            } => v.tensor(tensor, offset, data)?,
            Event::Snapshot { .. } => Flow::Continue,
            Event::Records(_) if !v.wants_records() => Flow::Continue,
            Event::Records(mut c) => {
                let mut flow = Flow::Continue;
                while c.next_into(&mut rec).map_err(&te)? {
                    flow = v.record(&rec, c.strings())?;
                    if flow == Flow::Stop {
                        break;
                    }
                }
                flow
            }
        };
        stopped = flow == Flow::Stop;
    }
    let at = s.offset();
    let footer = s.footer().ok_or_else(|| {
        te(FormatError::Truncated {
            offset: at,
            expected: "the footer".into(),
        })
    })?;
    let verify = s.verify_spec().ok_or_else(|| {
        te(FormatError::Malformed {
            offset: at,
            what: "trace".into(),
            detail: "no verify chunk".into(),
        })
    })?;
    let channels = || s.channels().map_err(&te);
    v.end(&End {
        meta: s.meta(),
        strings: s.strings(),
        verify,
        footer,
        launches: s.launches(),
        channels: &channels,
        complete: !stopped,
    })
}

/// A visitor from a closure over records (for simple passes and tests).
#[derive(Debug)]
pub struct Records<F>(pub F);

impl<F: FnMut(&Record, &Strings) -> Result<Flow>> Visitor for Records<F> {
    fn record(&mut self, r: &Record, strings: &Strings) -> Result<Flow> {
        (self.0)(r, strings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    #[derive(Default)]
    struct Log {
        events: Vec<String>,
        stop_after: Option<usize>,
        end_complete: Option<bool>,
    }

    impl Visitor for Log {
        fn meta(&mut self, meta: &Meta) -> Result<Flow> {
            self.events.push(format!("meta {}", meta.benchmark));
            Ok(Flow::Continue)
        }
        fn tensor(&mut self, t: u32, off: u64, data: &[u8]) -> Result<Flow> {
            self.events.push(format!("tensor {t} {off} {}", data.len()));
            Ok(Flow::Continue)
        }
        fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
            self.events
                .push(format!("op {} {}", r.op_id, s.name(r.component)));
            let n = self.events.iter().filter(|e| e.starts_with("op")).count();
            Ok(if Some(n) == self.stop_after {
                Flow::Stop
            } else {
                Flow::Continue
            })
        }
        fn end(&mut self, end: &End<'_>) -> Result<()> {
            self.end_complete = Some(end.complete);
            Ok(())
        }
    }

    #[test]
    fn file_and_stream_visit_the_same_events() {
        let bytes = testutil::sample_trace();
        let (_d, path) = testutil::write_temp(&bytes);
        let mut a = Log::default();
        visit_file("a", &path, &mut a).unwrap();
        let mut b = Log::default();
        visit_reader("b", &bytes[..], &mut b).unwrap();
        assert_eq!(a.events, b.events);
        assert_eq!(a.events[0], "meta sample");
        assert!(a.events.iter().any(|e| e.starts_with("tensor 0 0 ")));
        assert_eq!(a.end_complete, Some(true));
    }

    #[test]
    fn stop_still_validates_the_rest() {
        let bytes = testutil::sample_trace();
        let mut a = Log {
            stop_after: Some(2),
            ..Default::default()
        };
        visit_reader("s", &bytes[..], &mut a).unwrap();
        assert_eq!(a.events.iter().filter(|e| e.starts_with("op")).count(), 2);
        assert_eq!(a.end_complete, Some(false));
        // The same early stop over a truncated stream is still an error.
        let cut = &bytes[..bytes.len() - 100];
        let mut b = Log {
            stop_after: Some(1),
            ..Default::default()
        };
        let err = visit_reader("cut", cut, &mut b).unwrap_err();
        assert!(err.to_string().starts_with("cut: "), "{err}");
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn input_parse() {
        assert_eq!(Input::parse("-"), Input::Stdin);
        assert_eq!(Input::parse("x.kbt"), Input::Path("x.kbt".into()));
        assert_eq!(Input::Stdin.to_string(), "<stdin>");
    }
}
