//! What the run counts: per-operation outcomes into the current interval, the run total and
//! the current phase; closed intervals; the phase label read from the phase file. Turns
//! them into the interval lines and the JSON summary. No I/O.
//!
//! Owns: the counts, intervals and the summary's shape. Imports only `histogram`; must
//! not import `target` or `run`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::histogram::Histogram;

/// Distinct error messages kept for the summary.
const MAX_SAMPLES: usize = 40;
/// Longest phase label kept.
const MAX_PHASE_CHARS: usize = 64;
/// The phase before any label is read.
pub(crate) const DEFAULT_PHASE: &str = "run";

/// A failed call: its gRPC code name (or `CLIENT`) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallError {
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

/// The outcome of one operation of a worker.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// DoGet answered with exactly the expected value.
    Hit,
    /// DoGet answered NOT_FOUND.
    Miss,
    /// DoGet answered with a different value.
    Corrupt(String),
    /// DoGet failed otherwise.
    GetError(CallError),
    /// A refill DoPut after a miss succeeded.
    PutOk,
    /// A refill DoPut failed.
    PutError(CallError),
}

/// The summary fields of [`Counters`] (in the totals, each phase and each interval).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CounterFields {
    pub(crate) gets: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) corrupt: u64,
    pub(crate) puts: u64,
    pub(crate) errors: u64,
    pub(crate) errors_by_code: BTreeMap<&'static str, u64>,
    /// Tries that failed because their connection was lost, each followed by another
    /// try of the same call (not failed calls: a failed call is counted in `errors`).
    pub(crate) retried: u64,
    pub(crate) ops: u64,
    pub(crate) ops_per_s: Option<f64>,
    pub(crate) hit_ratio: Option<f64>,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) max_ms: Option<f64>,
}

/// The run's totals.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Totals {
    #[serde(flatten)]
    pub(crate) counts: CounterFields,
    pub(crate) seconds: f64,
}

/// One phase of the run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PhaseReport {
    pub(crate) phase: String,
    pub(crate) seconds: f64,
    pub(crate) intervals: usize,
    pub(crate) error_intervals: usize,
    pub(crate) max_consecutive_error_intervals: u64,
    #[serde(flatten)]
    pub(crate) counts: CounterFields,
}

/// One closed interval.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct IntervalReport {
    pub(crate) t_s: f64,
    pub(crate) seconds: f64,
    pub(crate) phase: String,
    #[serde(flatten)]
    pub(crate) counts: CounterFields,
}

/// The `totals`, `phases`, `intervals` and derived fields of the summary.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) totals: Totals,
    pub(crate) max_consecutive_error_intervals: u64,
    pub(crate) max_consecutive_error_s: f64,
    pub(crate) phases: Vec<PhaseReport>,
    pub(crate) error_samples: Vec<String>,
    /// Samples of the failures that were tried again (see [`CounterFields::retried`]).
    pub(crate) retry_samples: Vec<String>,
    pub(crate) corrupt_samples: Vec<String>,
    pub(crate) intervals: Vec<IntervalReport>,
}

/// Counts over some span (an interval, a phase, the run).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub(crate) gets: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) corrupt: u64,
    pub(crate) puts: u64,
    pub(crate) errors: u64,
    pub(crate) errors_by_code: BTreeMap<&'static str, u64>,
    /// See [`CounterFields::retried`].
    pub(crate) retried: u64,
    /// Latency of gets (hits, misses, corrupt and failed alike).
    pub(crate) latency: Histogram,
}

impl Counters {
    fn add(&mut self, outcome: &Outcome, latency: Duration) {
        match outcome {
            Outcome::Hit => self.hits += 1,
            Outcome::Miss => self.misses += 1,
            Outcome::Corrupt(_) => self.corrupt += 1,
            Outcome::GetError(err) | Outcome::PutError(err) => {
                self.errors += 1;
                *self.errors_by_code.entry(err.code).or_default() += 1;
            }
            Outcome::PutOk => {}
        }
        match outcome {
            Outcome::Hit | Outcome::Miss | Outcome::Corrupt(_) | Outcome::GetError(_) => {
                self.gets += 1;
                self.latency.record(latency);
            }
            Outcome::PutOk | Outcome::PutError(_) => self.puts += 1,
        }
    }

    /// Hits over all gets (a failed get is not a hit); `None` without gets.
    pub(crate) fn hit_ratio(&self) -> Option<f64> {
        (self.gets > 0).then(|| self.hits as f64 / self.gets as f64)
    }

    /// The summary fields of these counts over `seconds`.
    pub(crate) fn to_json(&self, seconds: f64) -> CounterFields {
        let ms = |micros: Option<u64>| micros.map(|us| round3(us as f64 / 1000.0));
        let ops = self.gets + self.puts;
        let ops_per_s = if seconds > 0.0 {
            Some(round3(ops as f64 / seconds))
        } else {
            None
        };
        CounterFields {
            gets: self.gets,
            hits: self.hits,
            misses: self.misses,
            corrupt: self.corrupt,
            puts: self.puts,
            errors: self.errors,
            errors_by_code: self.errors_by_code.clone(),
            retried: self.retried,
            ops,
            ops_per_s,
            hit_ratio: self.hit_ratio().map(round6),
            p50_ms: ms(self.latency.quantile(0.5)),
            p99_ms: ms(self.latency.quantile(0.99)),
            max_ms: ms(self.latency.max()),
        }
    }

    /// One human-readable line (without time and phase).
    pub(crate) fn line(&self, seconds: f64) -> String {
        let ops_per_s = if seconds > 0.0 {
            (self.gets + self.puts) as f64 / seconds
        } else {
            0.0
        };
        let hit = self
            .hit_ratio()
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.4}"));
        let ms = |micros: Option<u64>| {
            micros.map_or_else(
                || "-".to_owned(),
                |us| format!("{:.2}ms", us as f64 / 1000.0),
            )
        };
        let mut errors = self.errors.to_string();
        if !self.errors_by_code.is_empty() {
            let by_code: Vec<String> = self
                .errors_by_code
                .iter()
                .map(|(code, n)| format!("{code}={n}"))
                .collect();
            errors = format!("{errors}({})", by_code.join(","));
        }
        let retried = if self.retried > 0 {
            format!(" retried={}", self.retried)
        } else {
            String::new()
        };
        format!(
            "ops/s={ops_per_s:.0} gets={} hit={hit} misses={} refills={} corrupt={} errors={errors}{retried} p50={} p99={}",
            self.gets,
            self.misses,
            self.puts,
            self.corrupt,
            ms(self.latency.quantile(0.5)),
            ms(self.latency.quantile(0.99)),
        )
    }
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// A closed reporting interval.
#[derive(Debug, Clone)]
pub(crate) struct Interval {
    /// Seconds since the run phase started, at the interval's end.
    pub(crate) end_s: f64,
    pub(crate) seconds: f64,
    /// The phase label current when the interval closed.
    pub(crate) phase: String,
    pub(crate) counters: Counters,
}

#[derive(Debug)]
struct PhaseStats {
    label: String,
    counters: Counters,
    seconds: f64,
}

#[derive(Debug)]
struct State {
    interval: Counters,
    total: Counters,
    phases: Vec<PhaseStats>,
    current_phase: usize,
    phase_since: Instant,
    intervals: Vec<Interval>,
    error_samples: Vec<String>,
    retry_samples: Vec<String>,
    corrupt_samples: Vec<String>,
}

/// Shared by all workers, the reporter and the phase watcher.
#[derive(Debug)]
pub(crate) struct Recorder {
    state: Mutex<State>,
}

impl Recorder {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            state: Mutex::new(State {
                interval: Counters::default(),
                total: Counters::default(),
                phases: vec![PhaseStats {
                    label: DEFAULT_PHASE.to_owned(),
                    counters: Counters::default(),
                    seconds: 0.0,
                }],
                current_phase: 0,
                phase_since: now,
                intervals: Vec::new(),
                error_samples: Vec::new(),
                retry_samples: Vec::new(),
                corrupt_samples: Vec::new(),
            }),
        }
    }

    /// Counts one operation in the interval, the total and the current phase.
    pub(crate) fn record(&self, op: &str, outcome: &Outcome, latency: Duration) {
        let mut state = self.state.lock();
        state.interval.add(outcome, latency);
        state.total.add(outcome, latency);
        let phase = state.current_phase;
        if let Some(stats) = state.phases.get_mut(phase) {
            stats.counters.add(outcome, latency);
        }
        match outcome {
            Outcome::GetError(err) | Outcome::PutError(err) => {
                // Named by phase, so a failure points at the change that caused it.
                let label = state
                    .phases
                    .get(phase)
                    .map_or("", |stats| stats.label.as_str());
                // With the time the first of its kind ended, to be read beside the
                // nodes' logs; one sample per kind.
                let kind = format!("{label}: {op} {}: {}", err.code, err.message);
                let seen = state
                    .error_samples
                    .iter()
                    .any(|sample| sample.split_once(' ').is_some_and(|(_, rest)| rest == kind));
                if !seen {
                    let at = humantime::format_rfc3339_millis(std::time::SystemTime::now());
                    add_sample(&mut state.error_samples, format!("{at} {kind}"));
                }
            }
            Outcome::Corrupt(what) => add_sample(&mut state.corrupt_samples, what.clone()),
            Outcome::Hit | Outcome::Miss | Outcome::PutOk => {}
        }
    }

    /// Counts tries of `op` that failed with `failures` because their connection was lost
    /// and were followed by another try (see [`CounterFields::retried`]).
    pub(crate) fn record_retried(&self, op: &str, failures: &[CallError]) {
        if failures.is_empty() {
            return;
        }
        let mut state = self.state.lock();
        let n = failures.len() as u64;
        state.interval.retried += n;
        state.total.retried += n;
        let phase = state.current_phase;
        let label = match state.phases.get_mut(phase) {
            Some(stats) => {
                stats.counters.retried += n;
                stats.label.clone()
            }
            None => String::new(),
        };
        for err in failures {
            let sample = format!("{label}: {op} {}: {}", err.code, err.message);
            add_sample(&mut state.retry_samples, sample);
        }
    }

    /// Sets the phase label (from the phase file); operations from now on count in it.
    pub(crate) fn set_phase(&self, label: &str, now: Instant) {
        let label: String = label.chars().take(MAX_PHASE_CHARS).collect();
        let mut state = self.state.lock();
        let current = state.current_phase;
        if state.phases.get(current).is_some_and(|p| p.label == label) {
            return;
        }
        let spent = now
            .saturating_duration_since(state.phase_since)
            .as_secs_f64();
        if let Some(stats) = state.phases.get_mut(current) {
            stats.seconds += spent;
        }
        state.phase_since = now;
        state.current_phase = match state.phases.iter().position(|p| p.label == label) {
            Some(i) => i,
            None => {
                state.phases.push(PhaseStats {
                    label,
                    counters: Counters::default(),
                    seconds: 0.0,
                });
                state.phases.len() - 1
            }
        };
    }

    /// Closes the current interval (ending `end_s` seconds into the run, `seconds` long).
    pub(crate) fn close_interval(&self, end_s: f64, seconds: f64) -> Interval {
        let mut state = self.state.lock();
        let counters = std::mem::take(&mut state.interval);
        let phase = state
            .phases
            .get(state.current_phase)
            .map_or_else(|| DEFAULT_PHASE.to_owned(), |p| p.label.clone());
        let interval = Interval {
            end_s,
            seconds,
            phase,
            counters,
        };
        state.intervals.push(interval.clone());
        interval
    }

    /// The run's totals so far.
    pub(crate) fn total(&self) -> Counters {
        self.state.lock().total.clone()
    }

    /// The `totals`, `phases`, `intervals` and derived fields of the summary, as of `now`
    /// after `run_s` seconds of running.
    pub(crate) fn report(&self, run_s: f64, interval_s: f64, now: Instant) -> Report {
        let state = self.state.lock();
        let longest = longest_error_run(state.intervals.iter());
        let phases = state
            .phases
            .iter()
            .enumerate()
            .filter(|(i, p)| p.counters.gets + p.counters.puts > 0 || *i == state.current_phase)
            .map(|(i, p)| {
                let mut seconds = p.seconds;
                if i == state.current_phase {
                    seconds += now
                        .saturating_duration_since(state.phase_since)
                        .as_secs_f64();
                }
                let mine = || state.intervals.iter().filter(|iv| iv.phase == p.label);
                PhaseReport {
                    phase: p.label.clone(),
                    seconds: round3(seconds),
                    intervals: mine().count(),
                    error_intervals: mine().filter(|iv| iv.counters.errors > 0).count(),
                    max_consecutive_error_intervals: longest_error_run(mine()),
                    counts: p.counters.to_json(seconds),
                }
            })
            .collect();
        let intervals = state
            .intervals
            .iter()
            .map(|iv| IntervalReport {
                t_s: round3(iv.end_s),
                seconds: round3(iv.seconds),
                phase: iv.phase.clone(),
                counts: iv.counters.to_json(iv.seconds),
            })
            .collect();
        Report {
            totals: Totals {
                counts: state.total.to_json(run_s),
                seconds: round3(run_s),
            },
            max_consecutive_error_intervals: longest,
            max_consecutive_error_s: round3(longest as f64 * interval_s),
            phases,
            error_samples: state.error_samples.clone(),
            retry_samples: state.retry_samples.clone(),
            corrupt_samples: state.corrupt_samples.clone(),
            intervals,
        }
    }
}

fn add_sample(samples: &mut Vec<String>, sample: String) {
    if samples.len() < MAX_SAMPLES && !samples.contains(&sample) {
        samples.push(sample);
    }
}

/// The longest run of consecutive intervals that saw an error.
fn longest_error_run<'a>(intervals: impl Iterator<Item = &'a Interval>) -> u64 {
    let (mut longest, mut run) = (0, 0);
    for interval in intervals {
        if interval.counters.errors > 0 {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn unavailable() -> Outcome {
        Outcome::GetError(CallError {
            code: "UNAVAILABLE",
            message: "owner gone".into(),
        })
    }

    #[test]
    fn outcomes_count_per_interval_phase_and_total() {
        let t0 = Instant::now();
        let recorder = Recorder::new(t0);
        let ms = Duration::from_millis(1);
        recorder.record("get", &Outcome::Hit, ms);
        recorder.record("get", &Outcome::Miss, ms);
        recorder.record("put", &Outcome::PutOk, ms);
        recorder.close_interval(1.0, 1.0);
        recorder.set_phase("restart", t0 + Duration::from_secs(1));
        recorder.record("get", &unavailable(), ms);
        recorder.record("get", &unavailable(), ms);
        recorder.close_interval(2.0, 1.0);
        recorder.record("get", &unavailable(), ms);
        recorder.close_interval(3.0, 1.0);
        recorder.set_phase("steady", t0 + Duration::from_secs(3));
        recorder.record("get", &Outcome::Corrupt("load/1: bad".into()), ms);
        recorder.record("get", &Outcome::Hit, ms);
        recorder.close_interval(4.0, 1.0);

        let report =
            serde_json::to_value(recorder.report(4.0, 1.0, t0 + Duration::from_secs(4))).unwrap();
        let totals = &report["totals"];
        assert_eq!(totals["gets"], 7);
        assert_eq!(totals["hits"], 2);
        assert_eq!(totals["misses"], 1);
        assert_eq!(totals["puts"], 1);
        assert_eq!(totals["corrupt"], 1);
        assert_eq!(totals["errors"], 3);
        assert_eq!(totals["errors_by_code"]["UNAVAILABLE"], 3);
        assert_eq!(totals["hit_ratio"], json!(round6(2.0 / 7.0)));
        assert_eq!(report["max_consecutive_error_intervals"], 2);
        // One sample for the three errors of one kind, with when the first ended.
        let samples = report["error_samples"].as_array().unwrap();
        assert_eq!(samples.len(), 1, "{samples:?}");
        let (at, kind) = samples[0].as_str().unwrap().split_once(' ').unwrap();
        assert_eq!(kind, "restart: get UNAVAILABLE: owner gone");
        assert!(humantime::parse_rfc3339(at).is_ok(), "{at}");
        assert_eq!(report["corrupt_samples"], json!(["load/1: bad"]));
        let phases = report["phases"].as_array().unwrap();
        let labels: Vec<&str> = phases
            .iter()
            .map(|p| p["phase"].as_str().unwrap())
            .collect();
        assert_eq!(labels, ["run", "restart", "steady"]);
        assert_eq!(phases[1]["errors"], 3);
        assert_eq!(phases[1]["seconds"], 2.0);
        assert_eq!(phases[1]["max_consecutive_error_intervals"], 2);
        assert_eq!(phases[2]["hit_ratio"], 0.5);
        let intervals = report["intervals"].as_array().unwrap();
        assert_eq!(intervals.len(), 4);
        assert_eq!(intervals[1]["phase"], "restart");
        assert_eq!(intervals[1]["ops_per_s"], 2.0);
        assert_eq!(intervals[0]["hit_ratio"], 0.5);
    }

    #[test]
    fn an_interval_without_gets_has_no_ratio_and_the_line_says_so() {
        let counters = Counters::default();
        assert_eq!(
            serde_json::to_value(counters.to_json(1.0)).unwrap()["hit_ratio"],
            Value::Null
        );
        assert!(counters.line(1.0).contains("hit=-"));
    }
}
