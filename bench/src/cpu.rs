//! CPU time of the processes a multi-process bench runs, read from `/proc` (Linux): where
//! the machine's cores went, so that a bound found in wall time can be put on a process.
//!
//! `/proc/PID/stat` gives a process's user and system time in clock ticks of `USER_HZ`,
//! which Linux fixes at 100 for this interface on every architecture it runs the bench on.

use std::collections::BTreeMap;

/// Ticks of `/proc`'s CPU times in a second (`USER_HZ`).
const TICKS_PER_SECOND: f64 = 100.0;

/// A process's user plus system time so far, in ticks; `None` once it is gone.
pub fn process_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields count from after it.
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of stat(5), utime 14 and stime 15.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    user.checked_add(system)
}

/// Every process whose command is `postgres` (the server and its backends), with its
/// ticks so far.
fn postgres_ticks() -> BTreeMap<u32, u64> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres")
        })
        .filter_map(|pid| Some((pid, process_ticks(pid)?)))
        .collect()
}

/// The machine's busy and total ticks over all cores (`/proc/stat`'s first line).
fn machine_ticks() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let Some(line) = text.lines().next() else {
        return (0, 0);
    };
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|value| value.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// CPU time spent from [`CpuMeter::start`] to the last [`CpuMeter::sample`].
pub struct CpuMeter {
    processes: Vec<u32>,
    first: Vec<Option<u64>>,
    last: Vec<Option<u64>>,
    postgres_first: BTreeMap<u32, u64>,
    postgres_last: BTreeMap<u32, u64>,
    machine_first: (u64, u64),
    machine_last: (u64, u64),
}

/// What a [`CpuMeter`] measured, in CPU seconds.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CpuSpent {
    /// Each watched process's, in the order given.
    pub processes: Vec<f64>,
    /// PostgreSQL's: every `postgres` process's, backends that came and went included
    /// only for the part of their life that was sampled.
    pub postgres: f64,
    /// The machine's busy time, every process's.
    pub machine_busy: f64,
    /// The machine's capacity: wall time times its cores.
    pub machine_total: f64,
}

impl CpuMeter {
    /// Starts measuring `processes` (this one's too, if it is listed), PostgreSQL and the
    /// machine.
    pub fn start(processes: Vec<u32>) -> CpuMeter {
        let first: Vec<Option<u64>> = processes.iter().map(|pid| process_ticks(*pid)).collect();
        let postgres = postgres_ticks();
        let machine = machine_ticks();
        CpuMeter {
            processes,
            last: first.clone(),
            first,
            postgres_last: postgres.clone(),
            postgres_first: postgres,
            machine_first: machine,
            machine_last: machine,
        }
    }

    /// Reads every counter again; a process that has gone keeps its last reading.
    pub fn sample(&mut self) {
        for (pid, last) in self.processes.iter().zip(self.last.iter_mut()) {
            if let Some(ticks) = process_ticks(*pid) {
                *last = Some(ticks);
            }
        }
        for (pid, ticks) in postgres_ticks() {
            self.postgres_last.insert(pid, ticks);
        }
        self.machine_last = machine_ticks();
    }

    /// The CPU seconds spent between the start and the last sample.
    pub fn spent(&self) -> CpuSpent {
        let seconds = |ticks: u64| ticks as f64 / TICKS_PER_SECOND;
        let processes = self
            .first
            .iter()
            .zip(&self.last)
            .map(|(first, last)| match (first, last) {
                (Some(first), Some(last)) => seconds(last.saturating_sub(*first)),
                _ => 0.0,
            })
            .collect();
        let postgres = self
            .postgres_last
            .iter()
            .map(|(pid, last)| {
                let first = self.postgres_first.get(pid).copied().unwrap_or(0);
                last.saturating_sub(first)
            })
            .sum();
        CpuSpent {
            processes,
            postgres: seconds(postgres),
            machine_busy: seconds(self.machine_last.0.saturating_sub(self.machine_first.0)),
            machine_total: seconds(self.machine_last.1.saturating_sub(self.machine_first.1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's reading grows while it spins: the parser reads the time fields,
    /// not ones that stand still.
    #[test]
    fn a_spinning_process_is_seen_spending_cpu() {
        let me = std::process::id();
        let before = process_ticks(me).expect("this process's stat");
        let started = std::time::Instant::now();
        let mut spins = 0u64;
        while process_ticks(me).unwrap_or(0) < before + 5 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "no CPU time seen after {spins} spins"
            );
            spins = spins.wrapping_add(std::hint::black_box(1));
        }
        let mut meter = CpuMeter::start(vec![me, u32::MAX]);
        let from = process_ticks(me).unwrap_or(0);
        while process_ticks(me).unwrap_or(0) < from + 3 {
            assert!(started.elapsed() < std::time::Duration::from_secs(40));
            spins = spins.wrapping_add(std::hint::black_box(1));
        }
        meter.sample();
        let spent = meter.spent();
        assert_eq!(spent.processes.len(), 2);
        assert!(spent.processes[0] >= 0.03, "{spent:?}");
        assert_eq!(spent.processes[1], 0.0, "no such process: {spent:?}");
        assert!(
            spent.machine_total > 0.0 && spent.machine_busy <= spent.machine_total,
            "{spent:?}"
        );
    }
}
