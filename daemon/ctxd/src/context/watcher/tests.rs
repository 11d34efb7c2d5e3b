//! The watcher's tests: real files in temporary folders, the real OS watcher, and the
//! bookkeeping driven directly where the OS cannot be made to fail on demand.

use super::*;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use notify::EventKind;
use notify::event::ModifyKind;
use notify_debouncer_full::DebouncedEvent;
use tokio::time::timeout;

use super::os_watches::is_limit;

const DEBOUNCE: Duration = Duration::from_millis(50);
/// Generous: a loaded test machine can be slow, and no test asserts a tight bound.
const WAIT: Duration = Duration::from_secs(5);
/// Long enough after a delivery that a second one for the same change would show.
const SETTLE: Duration = Duration::from_millis(400);

async fn next(sub: &mut Subscription) -> Vec<PathBuf> {
    match timeout(WAIT, sub.recv()).await {
        Ok(Some(paths)) => paths,
        Ok(None) => panic!("subscription ended"),
        Err(_) => panic!("no change delivered within {WAIT:?}"),
    }
}

async fn quiet(sub: &mut Subscription) {
    if let Ok(got) = timeout(SETTLE, sub.recv()).await {
        panic!("expected no delivery, got {got:?}");
    }
}

fn atomic_save(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_write_is_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("CLAUDE.md");
    std::fs::write(&file, "one").unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);

    std::fs::write(&file, "two").unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
    assert!(!watcher.degraded());
}

#[tokio::test]
async fn a_file_created_after_subscribing_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("CLAUDE.local.md");
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);

    std::fs::write(&file, "new").unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
}

#[tokio::test]
async fn atomic_saves_are_seen_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.md");
    std::fs::write(&file, "v1").unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);

    atomic_save(&file, "v2");
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
    // A watch on the file itself would be dead now; the folder watch is not.
    atomic_save(&file, "v3");
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
}

#[tokio::test]
async fn delete_and_recreate_are_both_seen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.md");
    std::fs::write(&file, "x").unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);

    std::fs::remove_file(&file).unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
    std::fs::write(&file, "y").unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
}

#[tokio::test]
async fn a_burst_of_writes_is_one_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("busy.md");
    std::fs::write(&file, "0").unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);

    for n in 0..20 {
        std::fs::write(&file, n.to_string()).unwrap();
    }
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
}

#[tokio::test]
async fn writes_closer_than_the_debounce_are_one_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("slow-burst.md");
    let watcher = Watcher::start(Duration::from_millis(300));
    let mut sub = watcher.subscribe([file.clone()]);

    // Gaps well under the 300 ms quiet period, spread over more than one period.
    for n in 0..6 {
        std::fs::write(&file, n.to_string()).unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    if let Ok(got) = timeout(Duration::from_millis(800), sub.recv()).await {
        panic!("expected one delivery, got another: {got:?}");
    }
}

#[tokio::test]
async fn each_subscriber_hears_only_its_own_paths() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.md");
    let b = dir.path().join("b.md");
    let shared = dir.path().join("shared.md");
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub_a = watcher.subscribe([a.clone(), shared.clone()]);
    let mut sub_b = watcher.subscribe([b.clone(), shared.clone()]);
    assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);

    std::fs::write(&a, "a").unwrap();
    assert_eq!(next(&mut sub_a).await, vec![a.clone()]);
    quiet(&mut sub_b).await;

    std::fs::write(&b, "b").unwrap();
    assert_eq!(next(&mut sub_b).await, vec![b.clone()]);
    quiet(&mut sub_a).await;

    std::fs::write(&shared, "s").unwrap();
    assert_eq!(next(&mut sub_a).await, vec![shared.clone()]);
    assert_eq!(next(&mut sub_b).await, vec![shared.clone()]);
}

#[tokio::test]
async fn changes_to_several_paths_come_together() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.md");
    let b = dir.path().join("sub/b.md");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([a.clone(), b.clone()]);

    std::fs::write(&a, "a").unwrap();
    std::fs::write(&b, "b").unwrap();
    std::fs::write(&a, "a2").unwrap();
    assert_eq!(next(&mut sub).await, vec![a, b]);
    quiet(&mut sub).await;
}

#[tokio::test]
async fn unsubscribing_stops_deliveries_and_frees_watches() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.md");
    let watcher = Watcher::start(DEBOUNCE);
    let mut kept = watcher.subscribe([file.clone()]);
    let mut gone = watcher.subscribe([file.clone()]);

    watcher.unsubscribe(gone.id());
    std::fs::write(&file, "x").unwrap();
    assert_eq!(next(&mut kept).await, vec![file.clone()]);
    // The stream of the removed subscriber ends without a delivery.
    assert_eq!(timeout(WAIT, gone.recv()).await.unwrap(), None);

    assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);
    drop(kept);
    assert_eq!(watcher.watched_dirs(), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn update_replaces_the_paths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("other")).unwrap();
    let old = dir.path().join("old.md");
    let new = dir.path().join("other/new.md");
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([old.clone()]);

    sub.update([new.clone()]);
    assert_eq!(watcher.watched_dirs(), vec![dir.path().join("other")]);
    std::fs::write(&old, "x").unwrap();
    std::fs::write(&new, "y").unwrap();
    assert_eq!(next(&mut sub).await, vec![new.clone()]);
    quiet(&mut sub).await;
}

#[tokio::test]
async fn added_paths_join_the_others() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let first = dir.path().join("first.md");
    let second = dir.path().join("sub/second.md");
    let rules = dir.path().join("rules");
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([first.clone()]);

    sub.add([second.clone(), first.clone()]);
    assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf(), dir.path().join("sub")]);
    std::fs::write(&first, "1").unwrap();
    assert_eq!(next(&mut sub).await, vec![first.clone()]);
    std::fs::write(&second, "2").unwrap();
    assert_eq!(next(&mut sub).await, vec![second.clone()]);

    // A file wanted again as a folder: its entries count now too.
    sub.add([Target::file(&rules)]);
    sub.add([Target::dir(&rules)]);
    std::fs::create_dir(&rules).unwrap();
    assert_eq!(next(&mut sub).await, vec![rules.clone()]);
    quiet(&mut sub).await;
    assert!(watcher.watched_dirs().contains(&rules));
    std::fs::write(rules.join("r.md"), "r").unwrap();
    assert_eq!(next(&mut sub).await, vec![rules.clone()]);

    // Every watch is released with the subscription: adding twice counted once.
    drop(sub);
    assert_eq!(watcher.watched_dirs(), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn reading_and_listing_are_not_changes() {
    use ctxd_core::memory::MemoryFs;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("CLAUDE.md");
    let rules = dir.path().join("rules");
    std::fs::write(&file, "x").unwrap();
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(rules.join("r.md"), "r").unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([Target::file(&file), Target::dir(&rules)]);

    let fs = super::super::fs::RealFs::new();
    for _ in 0..3 {
        fs.read(&file).unwrap();
        fs.list_dir(&rules).unwrap();
        fs.read(&rules.join("r.md")).unwrap();
    }
    quiet(&mut sub).await;
}

#[tokio::test]
async fn a_listed_folder_reports_new_and_removed_entries() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join(".claude/rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("old.md"), "x").unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([(rules.clone(), WatchKind::Dir)]);

    std::fs::write(rules.join("new.md"), "y").unwrap();
    assert_eq!(next(&mut sub).await, vec![rules.clone()]);
    quiet(&mut sub).await;
    std::fs::remove_file(rules.join("old.md")).unwrap();
    assert_eq!(next(&mut sub).await, vec![rules.clone()]);
    quiet(&mut sub).await;
}

#[tokio::test]
async fn a_file_under_folders_that_do_not_exist_yet_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a/b/c/CLAUDE.md");
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);
    assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);

    // Folders and file appear at once, before any deeper watch can exist.
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "x").unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
    assert_eq!(watcher.watched_dirs(), vec![dir.path().join("a/b/c")]);

    // The re-armed watch sees the next edit, an atomic save included.
    atomic_save(&file, "y");
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
}

#[tokio::test]
async fn a_folder_removed_and_made_again_is_watched_again() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("proj");
    let file = folder.join("CLAUDE.md");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(&file, "x").unwrap();
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);
    assert_eq!(watcher.watched_dirs(), vec![folder.clone()]);

    std::fs::remove_dir_all(&folder).unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
    assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);

    std::fs::create_dir(&folder).unwrap();
    // Seen through the ancestor watch, then through the folder's own.
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
    assert_eq!(watcher.watched_dirs(), vec![folder.clone()]);
    std::fs::write(&file, "again").unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
}

#[tokio::test]
async fn a_folder_renamed_away_and_replaced_is_watched_again() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("proj");
    let file = folder.join("CLAUDE.md");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(&file, "x").unwrap();
    // The parent's own file keeps the parent watched too.
    let top = dir.path().join("CLAUDE.md");
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone(), top.clone()]);

    // Swap in a new folder in one go, as some tools do.
    let staged = dir.path().join("proj.new");
    std::fs::create_dir(&staged).unwrap();
    std::fs::write(staged.join("CLAUDE.md"), "new").unwrap();
    std::fs::rename(&folder, dir.path().join("proj.old")).unwrap();
    std::fs::rename(&staged, &folder).unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;

    std::fs::write(&file, "edited").unwrap();
    assert_eq!(next(&mut sub).await, vec![file.clone()]);
    quiet(&mut sub).await;
    // Edits in the old folder, now elsewhere, are not about this path any more.
    std::fs::write(dir.path().join("proj.old/CLAUDE.md"), "old").unwrap();
    quiet(&mut sub).await;
}

#[tokio::test]
async fn memory_set_paths_can_be_passed_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let mut watched = BTreeMap::new();
    watched.insert(dir.path().join("CLAUDE.md"), WatchKind::File);
    watched.insert(dir.path().join(".claude/rules"), WatchKind::Dir);
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe(watched.iter());

    std::fs::create_dir_all(dir.path().join(".claude/rules")).unwrap();
    let got = next(&mut sub).await;
    assert_eq!(got, vec![dir.path().join(".claude/rules")]);
}

/// The three pieces together: discover memory files on the real disk, watch what the
/// loader looked at, and rebuild only when told.
#[tokio::test]
async fn memory_files_found_on_disk_are_watched() {
    use ctxd_core::memory::{MemoryConfig, discover};

    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let cwd = project.path();
    std::fs::write(cwd.join("CLAUDE.md"), "Use tabs.").unwrap();
    let config = MemoryConfig::new(home.path());
    let fs = super::super::fs::RealFs::new();

    let set = discover(cwd, &config, &fs);
    assert_eq!(set.active().count(), 1);
    let reads = fs.reads();
    assert!(reads > 0);
    let watcher = Watcher::start(DEBOUNCE);
    let mut sub = watcher.subscribe(set.watched().iter());

    // Nothing changed: nothing delivered, so the memoized context stays and the disk
    // is not touched again.
    quiet(&mut sub).await;
    assert_eq!(fs.reads(), reads);

    // An editor's atomic save of the project file, and a local file that did not exist.
    atomic_save(&cwd.join("CLAUDE.md"), "Use spaces.");
    std::fs::write(cwd.join("CLAUDE.local.md"), "Mine.").unwrap();
    assert_eq!(next(&mut sub).await, vec![cwd.join("CLAUDE.local.md"), cwd.join("CLAUDE.md")]);
    let set = discover(cwd, &config, &fs);
    let texts: Vec<&str> = set.active().map(|entry| entry.content.as_str()).collect();
    assert_eq!(texts, ["Use spaces.", "Mine."]);

    // A rule added to a rules folder that did not exist at discovery.
    sub.update(set.watched().iter());
    std::fs::create_dir_all(cwd.join(".claude/rules")).unwrap();
    std::fs::write(cwd.join(".claude/rules/style.md"), "Short lines.").unwrap();
    assert!(next(&mut sub).await.contains(&cwd.join(".claude/rules")));
}

#[test]
fn handles_can_move_between_tasks() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Watcher>();
    send_sync::<Subscription>();
}

#[test]
fn relative_paths_are_not_watched() {
    let targets = collect_targets([PathBuf::from("relative/CLAUDE.md"), PathBuf::from("/")]);
    assert!(targets.is_empty());
}

#[test]
fn limit_errors_are_recognised() {
    assert!(is_limit(&notify::Error::new(notify::ErrorKind::MaxFilesWatch)));
    assert!(is_limit(&notify::Error::io(std::io::Error::from_raw_os_error(28))));
    assert!(is_limit(&notify::Error::io(std::io::Error::from_raw_os_error(24))));
    assert!(!is_limit(&notify::Error::path_not_found()));
    assert!(!is_limit(&notify::Error::io(std::io::Error::from_raw_os_error(13))));
}

/// The debouncer holds events for a while to pair renames; the quiet period runs
/// from when the change happened, so that hold is not added on top of it.
#[test]
fn the_quiet_period_counts_from_the_change_not_from_its_hand_over() {
    let mut state = State::new(None, DEBOUNCE, Arc::new(AtomicBool::new(false)));
    let (tx, _rx) = unbounded_channel();
    let id = SubscriptionId(1);
    state.subs.insert(id, Sub::new(tx));
    let file = PathBuf::from("/w/CLAUDE.md");
    state.set_targets(id, collect_targets([file.clone()]));
    let modified = |time: Instant| DebouncedEvent {
        event: notify::Event::new(EventKind::Modify(ModifyKind::Any)).add_path(file.clone()),
        time,
    };

    let now = Instant::now() + Duration::from_secs(10);
    let changed = now - Duration::from_millis(30);
    state.ingest(vec![modified(changed)], now);
    assert_eq!(state.subs[&id].due, Some(changed + DEBOUNCE));
    // A newer change moves the deadline on; an older one handed over late does not
    // pull it back.
    state.ingest(vec![modified(now)], now);
    assert_eq!(state.subs[&id].due, Some(now + DEBOUNCE));
    state.ingest(vec![modified(changed)], now);
    assert_eq!(state.subs[&id].due, Some(now + DEBOUNCE));
    // Under a steady stream, the first change still caps the wait.
    let much_later = changed + DEBOUNCE * (MAX_DELAY_FACTOR + 2);
    state.ingest(vec![modified(much_later)], much_later);
    assert_eq!(state.subs[&id].due, Some(changed + DEBOUNCE * MAX_DELAY_FACTOR));
    // A timestamp from the future (it cannot be, but clocks are clocks) counts as now.
    let mut state = State::new(None, DEBOUNCE, Arc::new(AtomicBool::new(false)));
    let (tx, _rx) = unbounded_channel();
    state.subs.insert(id, Sub::new(tx));
    state.set_targets(id, collect_targets([file.clone()]));
    state.ingest(vec![modified(now + Duration::from_secs(5))], now);
    assert_eq!(state.subs[&id].due, Some(now + DEBOUNCE));
    assert_eq!(state.subs[&id].pending.iter().collect::<Vec<_>>(), [&file]);
}

#[test]
fn hitting_the_limit_degrades_and_warns_once() {
    let degraded = Arc::new(AtomicBool::new(false));
    let mut state = State::new(None, DEBOUNCE, Arc::clone(&degraded));
    let limit = notify::Error::new(notify::ErrorKind::MaxFilesWatch);
    state.watch_failed(Path::new("/a"), &limit);
    state.watch_failed(Path::new("/b"), &limit);
    assert!(degraded.load(Ordering::Relaxed));
    assert!(state.warned_limit);
    assert!(state.warned_dirs.is_empty());
}

#[test]
fn without_an_os_watcher_subscriptions_work_and_report_degraded() {
    let degraded = Arc::new(AtomicBool::new(true));
    let watcher = Watcher {
        shared: Arc::new(Shared {
            state: Mutex::new(State::new(None, DEBOUNCE, Arc::clone(&degraded))),
            degraded,
            next_id: AtomicU64::new(1),
        }),
    };
    let dir = tempfile::tempdir().unwrap();
    let mut sub = watcher.subscribe([dir.path().join("x.md")]);
    assert!(watcher.degraded());
    assert!(watcher.watched_dirs().is_empty());
    sub.update([dir.path().join("y.md")]);
    assert_eq!(sub.try_recv(), None);
}

#[test]
fn stamps_notice_writes_renames_and_removal() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.md");
    let missing = dir.path().join("missing.md");
    let later = dir.path().join("later.md");
    std::fs::write(&file, "one").unwrap();

    let seen = vec![
        (file.clone(), FileStamp::of(&file)),
        (missing.clone(), FileStamp::of(&missing)),
        (later.clone(), FileStamp::of(&later)),
    ];
    assert_eq!(seen[1].1, None);
    assert_eq!(changed_since(&seen), Vec::<PathBuf>::new());

    // Same size, and possibly the same modification time on a coarse clock: the
    // rename still shows as a new file.
    atomic_save(&file, "two");
    std::fs::write(&later, "now").unwrap();
    assert_eq!(changed_since(&seen), vec![file.clone(), later.clone()]);

    let seen = vec![(file.clone(), FileStamp::of(&file))];
    std::fs::remove_file(&file).unwrap();
    assert_eq!(changed_since(&seen), vec![file.clone()]);
}

#[test]
fn looking_again_finds_changed_sources_and_reads_changed_since_they_were_read() {
    use ctxd_core::ledger::{Ledger, ReadMarker};

    let dir = tempfile::tempdir().unwrap();
    let memory = dir.path().join("CLAUDE.md");
    let quiet_read = dir.path().join("quiet.rs");
    let edited_read = dir.path().join("edited.rs");
    std::fs::write(&memory, "v1").unwrap();
    for path in [&quiet_read, &edited_read] {
        std::fs::write(path, "fn a() {}\n").unwrap();
    }
    let mut ledger = Ledger::default();
    for path in [&quiet_read, &edited_read] {
        ledger.record_marker(&ReadMarker::measure(&path.display().to_string(), "fn a() {}\n", None, None, None));
    }
    let reads: Vec<_> = ledger.newest_first().into_iter().cloned().collect();

    // Read and then edited before the first look: found by content.
    std::fs::write(&edited_read, "fn b() {}\n").unwrap();
    let (changed, seen) = look_again(&[], vec![memory.clone()], &reads);
    assert_eq!(changed, vec![edited_read.clone()]);
    assert_eq!(seen.len(), 3);
    // Nothing touched: nothing found.
    let (changed, seen) = look_again(&seen, vec![memory.clone()], &reads);
    assert_eq!(changed, Vec::<PathBuf>::new());
    // A memory source saved atomically and a read file removed.
    atomic_save(&memory, "v2");
    std::fs::remove_file(&quiet_read).unwrap();
    let (changed, _) = look_again(&seen, vec![memory.clone()], &reads);
    assert_eq!(changed, vec![memory.clone(), quiet_read.clone()]);
}

#[test]
fn a_disabled_watcher_is_degraded_and_arms_nothing() {
    let watcher = Watcher::disabled();
    let dir = tempfile::tempdir().unwrap();
    let _sub = watcher.subscribe([dir.path().join("CLAUDE.md")]);
    assert!(watcher.degraded());
    assert!(watcher.watched_dirs().is_empty());
}

/// Write-to-delivery latency over 30 edits with the default debounce. Asserts only
/// that every edit arrives; run with `--nocapture` to see the distribution.
#[tokio::test]
async fn write_to_delivery_latency() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("timed.md");
    std::fs::write(&file, "start").unwrap();
    let watcher = Watcher::start(DEFAULT_DEBOUNCE);
    let mut sub = watcher.subscribe([file.clone()]);

    let mut samples = Vec::new();
    for n in 0..30 {
        let started = Instant::now();
        if n % 2 == 0 {
            std::fs::write(&file, format!("edit {n}")).unwrap();
        } else {
            atomic_save(&file, &format!("edit {n}"));
        }
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        samples.push(started.elapsed());
        // Let the quiet period pass so edits do not merge.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "write -> delivery with {DEFAULT_DEBOUNCE:?} debounce over {} edits: min {:?}, median {:?}, p90 {:?}, max {:?}",
        samples.len(),
        samples[0],
        at(0.5),
        at(0.9),
        samples[samples.len() - 1]
    );
}
