//! A provider's `[providers.NAME.budget]` read through `Settings`.

use std::path::Path;

use crate::config::Settings;

fn parse(budget: &str) -> Settings {
    let text = format!(
        "[database]\nurl = \"sqlite://t.db\"\n[providers.gh]\nkind = \"github\"\n\
         schedule = \"0 * * * * *\"\n[providers.gh.budget]\n{budget}\n"
    );
    Settings::parse(Path::new("config.toml"), &text, None, &|_| true).expect("valid")
}

#[test]
fn windows_are_read_shortest_first_and_a_table_without_one_is_no_budget() {
    let settings = parse(
        "app = [{ requests = 1000, per = \"1d\" }, { requests = 100, per = \"15m\" }]\n\
         connection = [{ requests = 5000, per = \"1h\" }]\nlearn_from_headers = true",
    );
    let budget = settings.providers["gh"].budget.clone().expect("a budget");
    let windows: Vec<(u64, u64)> = budget
        .app
        .iter()
        .map(|window| (window.requests, window.per.as_secs()))
        .collect();
    assert_eq!(windows, [(100, 900), (1000, 86_400)]);
    assert_eq!(budget.connection.len(), 1);
    assert!(budget.learn_from_headers);
    assert!(parse("app = []\nlearn_from_headers = true").providers["gh"]
        .budget
        .is_none());
}
