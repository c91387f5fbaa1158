//! The job queue under faults, with real daemons: a database cut off over a slot, clocks
//! of instances apart by more than a schedule's period, and three daemons under load on
//! one server. Each slot of each connection is one job and one run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use sea_orm::{EntityTrait, QueryOrder};
use tributary::entities::sync_job::{self, JobStatus};
use tributary::entities::{connection, sync_run};

use crate::daemon::{daemon_table, eventually, Daemon};
use crate::db_proxy::DbProxy;
use crate::helpers::{backend, cursor_provider, mount_cursor_listing, spawn_app, Backend, TestApp};

/// `acme` with `users`, each listing `pages` pages of one record answered after `delay`,
/// on `schedule`.
async fn acme(
    app: &TestApp,
    users: &[String],
    pages: usize,
    delay: Duration,
    schedule: &str,
) -> String {
    for user in users {
        mount_cursor_listing(&app.api, user, user, pages, 1, delay).await;
    }
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    cursor_provider("acme", &app.api.uri(), &names).replace(
        "schedule = \"0 */15 * * * *\"",
        &format!("schedule = \"{schedule}\""),
    )
}

fn users(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user{i:02}")).collect()
}

async fn all_jobs(app: &TestApp) -> Vec<sync_job::Model> {
    sync_job::Entity::find()
        .order_by_asc(sync_job::Column::Id)
        .all(&app.db)
        .await
        .expect("sync_jobs")
}

async fn all_runs(app: &TestApp) -> Vec<sync_run::Model> {
    sync_run::Entity::find()
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .expect("sync_runs")
}

/// The first time at least `ahead` from now that is a multiple of `period` seconds.
fn next_slot_after(ahead: Duration, period: i64) -> DateTime<Utc> {
    let from = Utc::now() + chrono::TimeDelta::from_std(ahead).expect("a delta");
    let seconds = from.timestamp();
    let next = seconds - seconds.rem_euclid(period) + period;
    DateTime::from_timestamp(next, 0).expect("a time")
}

async fn sleep_until(at: DateTime<Utc>) {
    tokio::time::sleep((at - Utc::now()).to_std().unwrap_or_default()).await;
}

/// The run ids a job's outcome names (`run 12 succeeded, run 13 failed`).
fn runs_named(job: &sync_job::Model) -> Vec<i64> {
    let outcome = job.outcome.as_deref().unwrap_or_default();
    outcome
        .split([',', ';'])
        .filter_map(|part| part.trim().strip_prefix("run "))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// Every slot job is unique by its key, every run belongs to exactly one job, and every
/// job that ran names its runs; returns each (connection, slot)'s job.
fn one_job_and_one_run_per_slot(
    jobs: &[sync_job::Model],
    runs: &[sync_run::Model],
    logs: &str,
) -> BTreeMap<(i64, DateTime<Utc>), sync_job::Model> {
    let mut by_slot = BTreeMap::new();
    for job in jobs {
        let slot = job.slot_at.expect("only slot jobs are queued here");
        let key = (job.connection_id, slot);
        if let Some(earlier) = by_slot.insert(key, job.clone()) {
            panic!("two jobs of one slot: {earlier:?} and {job:?}\n{logs}");
        }
    }
    let mut run_of = BTreeMap::new();
    for job in jobs {
        let named = runs_named(job);
        match job.status {
            JobStatus::Done => assert_eq!(named.len(), 1, "a done job ran once: {job:?}\n{logs}"),
            // Never claimed, or stopped by the shutdown at the test's end.
            JobStatus::Skipped | JobStatus::Queued => {
                assert!(named.is_empty(), "{job:?}\n{logs}")
            }
            JobStatus::Interrupted => assert!(named.len() <= 1, "{job:?}\n{logs}"),
            status => panic!("a job left {status:?}: {job:?}\n{logs}"),
        }
        for run in named {
            if let Some(other) = run_of.insert(run, job.id) {
                panic!("run {run} named by jobs {other} and {}\n{logs}", job.id);
            }
        }
    }
    let run_ids: BTreeSet<i64> = runs.iter().map(|run| run.id).collect();
    let named: BTreeSet<i64> = run_of.keys().copied().collect();
    assert_eq!(run_ids, named, "every run is one job's run\n{logs}");
    by_slot
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_fired_while_the_database_is_cut_off_is_queued_once_it_is_back() {
    if backend() == Backend::Sqlite {
        // SQLite is a file this process opens: there is no server to restart and no
        // session to lose.
        return;
    }
    let app = spawn_app().await;
    let users = users(3);
    let providers = acme(&app, &users, 1, Duration::ZERO, "*/10 * * * * *").await;
    app.settings(&providers).await;
    // The daemon reaches the database through the proxy; the test's reads go direct.
    let proxy = DbProxy::start(&app.database_url).await;
    let config = app.dir.path().join("config.toml");
    let text = app
        .config_text(&format!("{}{providers}", daemon_table(None)))
        .replacen(&app.database_url, &proxy.url(&app.database_url), 1);
    std::fs::write(&config, text).expect("config written");
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "the daemon ready", || async {
        daemon.log().contains("Daemon ready.")
    })
    .await;

    // Cut off from a second before the slot until four seconds after it.
    let slot = next_slot_after(Duration::from_secs(2), 10);
    sleep_until(slot - chrono::TimeDelta::seconds(1)).await;
    proxy.cut();
    sleep_until(slot + chrono::TimeDelta::seconds(4)).await;
    proxy.restore();
    eventually(
        Duration::from_secs(20),
        "the slot's jobs done once the database is back",
        || async {
            all_jobs(&app)
                .await
                .iter()
                .filter(|job| job.slot_at == Some(slot) && job.status == JobStatus::Done)
                .count()
                == users.len()
        },
    )
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(20)), 0, "{}", daemon.log());

    let log = daemon.log();
    let jobs = all_jobs(&app).await;
    let runs = all_runs(&app).await;
    let by_slot = one_job_and_one_run_per_slot(&jobs, &runs, &log);
    let connections = connection::Entity::find().all(&app.db).await.unwrap();
    for connection in &connections {
        let job = by_slot
            .get(&(connection.id, slot))
            .unwrap_or_else(|| panic!("{}: no job of the slot\n{log}", connection.user_id));
        assert_eq!(job.status, JobStatus::Done, "{job:?}");
        let run = runs_named(job)[0];
        let run = runs.iter().find(|r| r.id == run).expect("the job's run");
        assert_eq!(run.user_id, connection.user_id);
        assert!(
            run.started_at >= slot + chrono::TimeDelta::seconds(4),
            "the slot ran once the database was back: {run:?}"
        );
    }
    assert!(
        log.contains("failed; trying again."),
        "the firing tried the database again:\n{log}"
    );
    assert!(
        log.contains("Slot queued once the database answered again."),
        "{log}"
    );
    assert!(!log.contains("the slot is given up"), "{log}");
}

/// Each connection's runs, by start, never overlap: the lease kept one at a time.
fn no_two_runs_of_a_connection_overlap(runs: &[sync_run::Model], logs: &str) {
    let mut by_user: BTreeMap<&str, Vec<&sync_run::Model>> = BTreeMap::new();
    for run in runs {
        by_user.entry(run.user_id.as_str()).or_default().push(run);
    }
    for (user, mut runs) in by_user {
        runs.sort_by_key(|run| run.started_at);
        for pair in runs.windows(2) {
            let ended = pair[0].finished_at.expect("every run finished");
            assert!(
                ended <= pair[1].started_at,
                "{user}: overlapping runs {pair:#?}\n{logs}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_under_load_run_each_slot_of_each_connection_once() {
    if backend() == Backend::Sqlite {
        // One daemon per SQLite file (see `daemon::several_daemons_share_the_work_...`).
        return;
    }
    const PERIOD: i64 = 3;
    let app = spawn_app().await;
    let users = users(16);
    // Two pages of one record, each answered after 150 ms: a run takes about half a
    // second, so the 16 connections keep the three daemons busy for part of each slot
    // (twice that overran the slots of MariaDB on two shared cores).
    let providers = acme(&app, &users, 2, Duration::from_millis(150), "*/3 * * * * *")
        .await
        .replace(
            "kind = \"rest\"\n",
            "kind = \"rest\"\nmax_concurrent_connections = 8\n",
        );
    app.settings(&providers).await;
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    let mut daemons: Vec<Daemon> = (0..3)
        .map(|i| Daemon::start(&config, app.dir.path().join(format!("daemon{i}.log"))))
        .collect();
    let logs = |daemons: &[Daemon]| {
        daemons
            .iter()
            .enumerate()
            .map(|(i, daemon)| format!("--- daemon {i} (pid {})\n{}", daemon.pid(), daemon.log()))
            .collect::<String>()
    };
    eventually(Duration::from_secs(30), "three daemons ready", || async {
        daemons
            .iter()
            .all(|daemon| daemon.log().contains("Daemon ready."))
    })
    .await;

    // Five slots watched, all three daemons firing each.
    let first = next_slot_after(Duration::ZERO, PERIOD);
    let slots: Vec<DateTime<Utc>> = (0..5)
        .map(|i| first + chrono::TimeDelta::seconds(i * PERIOD))
        .collect();
    let last = *slots.last().expect("slots");
    sleep_until(last).await;
    eventually(
        Duration::from_secs(30),
        "the last slot's jobs ended",
        || async {
            let jobs = all_jobs(&app).await;
            let ended = jobs
                .iter()
                .filter(|job| job.slot_at == Some(last))
                .filter(|job| matches!(job.status, JobStatus::Done | JobStatus::Skipped))
                .count();
            ended == users.len()
        },
    )
    .await;
    for daemon in &daemons {
        daemon.signal(Signal::SIGTERM);
    }
    for daemon in &mut daemons {
        assert_eq!(daemon.wait(Duration::from_secs(20)), 0, "{}", daemon.log());
    }

    let logs = logs(&daemons);
    let jobs = all_jobs(&app).await;
    let runs = all_runs(&app).await;
    let by_slot = one_job_and_one_run_per_slot(&jobs, &runs, &logs);
    no_two_runs_of_a_connection_overlap(&runs, &logs);
    let connections = connection::Entity::find().all(&app.db).await.unwrap();
    let mut holders = BTreeSet::new();
    for connection in &connections {
        let mut ran = 0;
        for slot in &slots {
            let job = by_slot
                .get(&(connection.id, *slot))
                .unwrap_or_else(|| panic!("{}: no job of slot {slot}\n{logs}", connection.user_id));
            match job.status {
                JobStatus::Done => ran += 1,
                // Missed only because the connection's run of an earlier slot was going.
                JobStatus::Skipped => assert!(
                    job.outcome.as_deref().is_some_and(
                        |outcome| outcome.contains("a run of the connection was going")
                    ),
                    "{job:?}"
                ),
                _ => panic!("{job:?}"),
            }
            if let Some(holder) = &job.holder {
                holders.insert(holder.split(':').nth(1).unwrap_or_default().to_string());
            }
        }
        assert!(
            ran >= slots.len() - 1,
            "{} ran in {ran} of {} slots\n{logs}",
            connection.user_id,
            slots.len()
        );
    }
    assert!(
        holders.len() >= 2,
        "the daemons shared the work: {holders:?}"
    );
}

/// libfaketime, which fakes the clock of the process it is preloaded into (Debian package
/// `faketime`; `TRIBUTARY_TEST_LIBFAKETIME` names another path). Fails, never skips, when
/// it is missing: the clock-skew test would otherwise pass without testing anything.
pub(crate) fn libfaketime() -> String {
    let path = std::env::var("TRIBUTARY_TEST_LIBFAKETIME").unwrap_or_else(|_| {
        format!(
            "/usr/lib/{}-linux-gnu/faketime/libfaketime.so.1",
            std::env::consts::ARCH
        )
    });
    assert!(
        std::path::Path::new(&path).exists(),
        "libfaketime is missing at {path}: install the Debian package `faketime` \
         (apt-get install faketime) or set TRIBUTARY_TEST_LIBFAKETIME"
    );
    // It must also work: `date` under it is half a minute ahead.
    let date = std::process::Command::new("date")
        .arg("+%s")
        .env("LD_PRELOAD", &path)
        .env("FAKETIME", "+30s")
        .output()
        .expect("date runs");
    let faked: i64 = String::from_utf8_lossy(&date.stdout)
        .trim()
        .parse()
        .expect("date prints seconds");
    let ahead = faked - Utc::now().timestamp();
    assert!(
        (28..=32).contains(&ahead),
        "libfaketime at {path} did not move the clock 30 s ahead ({ahead} s)"
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_clock_is_30_s_ahead_runs_no_slot_twice() {
    if backend() == Backend::Sqlite {
        // One daemon per SQLite file: no two instances to disagree.
        return;
    }
    let libfaketime = libfaketime();
    const PERIOD: i64 = 5;
    let app = spawn_app().await;
    let users = users(3);
    // Runs of about 1.5 s, one at a time per daemon: the daemon ahead cannot run every
    // slot early on its own, so the other runs some too, while the daemon ahead already
    // claims later slots of the same connections.
    let providers = acme(&app, &users, 2, Duration::from_millis(700), "*/5 * * * * *").await;
    app.settings(&providers).await;
    let config = app.write_config(&format!(
        "{}max_concurrent_runs = 1\n{providers}",
        daemon_table(None)
    ));
    let mut daemons = vec![
        Daemon::start(&config, app.dir.path().join("on_time.log")),
        Daemon::start_with(
            &config,
            app.dir.path().join("ahead.log"),
            &["--log", "info"],
            &[
                ("LD_PRELOAD", libfaketime.as_str()),
                ("FAKETIME", "+30s"),
                // tokio's timers keep the real monotonic clock.
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ],
        ),
    ];
    let logs = |daemons: &[Daemon]| {
        ["on time", "30 s ahead"]
            .iter()
            .zip(daemons)
            .map(|(name, daemon)| {
                format!("--- daemon {name} (pid {})\n{}", daemon.pid(), daemon.log())
            })
            .collect::<String>()
    };
    eventually(Duration::from_secs(30), "both daemons ready", || async {
        daemons
            .iter()
            .all(|daemon| daemon.log().contains("Daemon ready."))
    })
    .await;
    // Forty seconds: more than the skew, so the on-time daemon fires every slot the
    // daemon ahead fired half a minute before.
    let first = next_slot_after(Duration::ZERO, PERIOD);
    let last = first + chrono::TimeDelta::seconds(8 * PERIOD);
    sleep_until(last).await;
    eventually(
        Duration::from_secs(30),
        "the jobs of the on-time slots ended",
        || async {
            all_jobs(&app).await.iter().all(|job| {
                job.slot_at.is_some_and(|slot| slot > last)
                    || matches!(job.status, JobStatus::Done | JobStatus::Skipped)
            })
        },
    )
    .await;
    for daemon in &daemons {
        daemon.signal(Signal::SIGTERM);
    }
    for daemon in &mut daemons {
        assert_eq!(daemon.wait(Duration::from_secs(20)), 0, "{}", daemon.log());
    }

    let logs = logs(&daemons);
    let jobs = all_jobs(&app).await;
    let runs = all_runs(&app).await;
    let by_slot = one_job_and_one_run_per_slot(&jobs, &runs, &logs);
    for lease_taken in [
        "lost its connection's lease",
        "Runs left running by a stopped process were marked interrupted",
    ] {
        assert!(
            !logs.contains(lease_taken),
            "no daemon took the lease of the other's run as if it had expired\n{logs}"
        );
    }
    let end = Utc::now();
    for job in &jobs {
        assert!(
            job.started_at.is_none_or(|started| started <= end),
            "claims are stamped by the database's clock, not 30 s ahead: {job:?}\n{logs}"
        );
    }
    // Runs too, so that their times compare across instances (a run's end was stamped by
    // the database's clock when a lease marked it, its start by the process's own): each
    // run lies within its job's claim and end.
    for job in jobs.iter().filter(|job| job.status == JobStatus::Done) {
        for id in runs_named(job) {
            let run = runs.iter().find(|run| run.id == id).expect("the job's run");
            let (claimed, ended) = (job.started_at.expect("claimed"), job.finished_at);
            assert!(
                claimed <= run.started_at
                    && run.finished_at.is_some()
                    && run.finished_at <= ended,
                "runs are stamped by the database's clock, not 30 s ahead: {run:?} of {job:?}\n{logs}"
            );
        }
    }
    no_two_runs_of_a_connection_overlap(&runs, &logs);
    let connections = connection::Entity::find().all(&app.db).await.unwrap();
    let mut slot = first;
    while slot <= last {
        for connection in &connections {
            let job = by_slot
                .get(&(connection.id, slot))
                .unwrap_or_else(|| panic!("{}: no job of slot {slot}\n{logs}", connection.user_id));
            assert!(
                matches!(job.status, JobStatus::Done | JobStatus::Skipped),
                "{job:?}\n{logs}"
            );
        }
        slot += chrono::TimeDelta::seconds(PERIOD);
    }
    for job in jobs
        .iter()
        .filter(|job| job.slot_at.is_some_and(|slot| slot <= last))
    {
        assert!(
            !job.outcome
                .as_deref()
                .unwrap_or_default()
                .contains("interrupted")
                && !job
                    .outcome
                    .as_deref()
                    .unwrap_or_default()
                    .contains("failed"),
            "{job:?}\n{logs}"
        );
    }
}
