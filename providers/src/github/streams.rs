//! The streams of a GitHub connection: which endpoint each lists, its first page's query,
//! the repository a child stream lists for, and how a page is read.

use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::header::{HeaderMap, LINK};
use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

use super::GithubConfig;
use crate::adapter::{self, WatermarkField};
use crate::http::Answered;
use crate::quote::{quoted, truncated, MAX_QUOTED_CHARS};
use crate::rest::link;
use crate::{FetchContext, FetchError, Page, PagePosition, ParentRecord, StreamSpec, Watermark};

/// Every stream's records carry their last change here.
const UPDATED_AT: WatermarkField = WatermarkField::Time("updated_at");

/// The parent stream of the per-repository streams.
const REPOS: &str = "repos";

/// One stream a GitHub connection can sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GithubStream {
    /// `GET /issues`: every issue and pull request visible to the user (the primary stream).
    Issues,
    /// `GET /user/repos`: the repositories the user owns, collaborates on or reaches
    /// through an organization.
    Repos,
    /// `GET /repos/{owner}/{repo}/pulls`, per stored repository.
    PullRequests,
    /// `GET /repos/{owner}/{repo}/issues/comments`, per stored repository.
    IssueComments,
}

impl GithubStream {
    /// Every stream, the primary first.
    pub(crate) const ALL: [GithubStream; 4] = [
        GithubStream::Issues,
        GithubStream::Repos,
        GithubStream::PullRequests,
        GithubStream::IssueComments,
    ];

    /// The stream called `name` in config, if there is one.
    pub(crate) fn named(name: &str) -> Option<GithubStream> {
        GithubStream::ALL
            .into_iter()
            .find(|stream| stream.name() == name)
    }

    /// The name used in config and in `sync_runs.stream`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            GithubStream::Issues => "issues",
            GithubStream::Repos => REPOS,
            GithubStream::PullRequests => "pull_requests",
            GithubStream::IssueComments => "issue_comments",
        }
    }

    /// The stream as [`crate::ProviderKind::streams`] lists it.
    pub(crate) fn spec(self) -> StreamSpec {
        match self {
            GithubStream::Issues | GithubStream::Repos => StreamSpec::top(self.name()),
            GithubStream::PullRequests | GithubStream::IssueComments => {
                StreamSpec::child(self.name(), REPOS)
            }
        }
    }

    /// The records, for the error about a body of another shape.
    fn records(self) -> &'static str {
        match self {
            GithubStream::Issues => "issues",
            GithubStream::Repos => "repositories",
            GithubStream::PullRequests => "pull requests",
            GithubStream::IssueComments => "issue comments",
        }
    }
}

/// What one `fetch_page` call lists: the endpoint (with the repository of a child stream)
/// and the cursor.
#[derive(Debug)]
pub(crate) struct Listing {
    endpoint: Endpoint,
    /// The stream's cursor, the newest `updated_at` of its last complete run.
    since: Option<DateTime<Utc>>,
}

/// Why a listing cannot be asked for.
#[derive(Debug)]
pub(crate) enum NotListed {
    /// The request itself is wrong (a child stream asked without its parent).
    Error(FetchError),
    /// The stored parent names no repository: one bad record, skipped as a parent the
    /// API no longer lists, not a failed run.
    Parent(String),
}

/// The endpoint a stream lists, with the repository of a child stream.
#[derive(Debug)]
enum Endpoint {
    Issues,
    Repos,
    PullRequests(Repository),
    IssueComments(Repository),
}

impl Listing {
    /// The listing `context` asks for. A child stream needs the parent repository.
    pub(crate) fn new(
        stream: GithubStream,
        context: &FetchContext<'_>,
    ) -> Result<Listing, NotListed> {
        let repository = || match context.parent {
            Some(parent) => Repository::of_parent(stream, &parent).map_err(NotListed::Parent),
            None => Err(NotListed::Error(FetchError::Client {
                message: format!(
                    "the github stream {} is listed per repository, but no parent \
                     repository was given",
                    stream.name()
                ),
            })),
        };
        let endpoint = match stream {
            GithubStream::Issues => Endpoint::Issues,
            GithubStream::Repos => Endpoint::Repos,
            GithubStream::PullRequests => Endpoint::PullRequests(repository()?),
            GithubStream::IssueComments => Endpoint::IssueComments(repository()?),
        };
        Ok(Listing {
            endpoint,
            since: context.since.and_then(adapter::watermark_time),
        })
    }

    fn stream(&self) -> GithubStream {
        match self.endpoint {
            Endpoint::Issues => GithubStream::Issues,
            Endpoint::Repos => GithubStream::Repos,
            Endpoint::PullRequests(_) => GithubStream::PullRequests,
            Endpoint::IssueComments(_) => GithubStream::IssueComments,
        }
    }

    fn repository(&self) -> Option<&Repository> {
        match &self.endpoint {
            Endpoint::Issues | Endpoint::Repos => None,
            Endpoint::PullRequests(repository) | Endpoint::IssueComments(repository) => {
                Some(repository)
            }
        }
    }

    /// The first page's URL, with the query each endpoint's documentation gives.
    pub(crate) fn first_url(&self, config: &GithubConfig) -> Result<Url, FetchError> {
        let base = &config.base_url;
        let mut url = match &self.endpoint {
            Endpoint::Issues => adapter::endpoint(base, "/issues")?,
            Endpoint::Repos => adapter::endpoint(base, "/user/repos")?,
            Endpoint::PullRequests(repository) => repository.url(base, &["pulls"])?,
            Endpoint::IssueComments(repository) => repository.url(base, &["issues", "comments"])?,
        };
        url.query_pairs_mut()
            .extend_pairs(self.query())
            .append_pair("per_page", &config.per_page.to_string());
        Ok(url)
    }

    /// The first page's query, but for `per_page`.
    fn query(&self) -> Vec<(&'static str, String)> {
        let pairs = |pairs: &[(&'static str, &str)]| {
            pairs
                .iter()
                .map(|(name, value)| (*name, value.to_string()))
                .collect::<Vec<_>>()
        };
        // Every listing is newest change first. GitHub pages by page number, so a record
        // changed during the walk moves to the front: the records behind it shift one
        // place back and one is read twice (the key absorbs it), and its new `updated_at`
        // lies past the cursor, so the next run fetches it. Oldest first, the records
        // behind it would shift forward, and one would be skipped for good.
        let mut query = match self.endpoint {
            Endpoint::Issues => pairs(&[
                ("filter", "all"),
                ("state", "all"),
                ("sort", "updated"),
                ("direction", "desc"),
            ]),
            Endpoint::Repos => pairs(&[
                ("affiliation", "owner,collaborator,organization_member"),
                ("sort", "updated"),
                ("direction", "desc"),
            ]),
            // The endpoint has no `since`: newest change first, and the page stops at the
            // first pull request older than the cursor.
            Endpoint::PullRequests(_) => {
                pairs(&[("state", "all"), ("sort", "updated"), ("direction", "desc")])
            }
            Endpoint::IssueComments(_) => pairs(&[("sort", "updated"), ("direction", "desc")]),
        };
        let since = match self.endpoint {
            // Inclusive at GitHub: boundary ties are fetched again.
            Endpoint::Issues => self
                .since
                .map(|since| since.to_rfc3339_opts(SecondsFormat::Secs, true)),
            Endpoint::Repos | Endpoint::IssueComments(_) => self.since.and_then(updated_after),
            Endpoint::PullRequests(_) => None,
        };
        query.extend(since.map(|since| ("since", since)));
        query
    }

    /// How a page of this listing is read, where its body is read.
    pub(crate) fn reader(
        &self,
    ) -> impl Fn(&Answered<'_>) -> Result<Page, FetchError> + Send + Sync + 'static {
        let stream = self.stream();
        let stop_before = match self.endpoint {
            Endpoint::PullRequests(_) => self.since,
            _ => None,
        };
        move |answered| read_page(stream, stop_before, answered)
    }

    /// The fetch's outcome, with a repository the token can no longer see (404, or 403
    /// without the rate-limit signals [`super::GithubPolicy`] turns into waits) turned into
    /// a page saying the parent is gone, so the pipeline goes on with the next one.
    pub(crate) fn parent_gone_or(
        &self,
        fetched: Result<Page, FetchError>,
    ) -> Result<Page, FetchError> {
        let Some(repository) = self.repository() else {
            return fetched;
        };
        match fetched {
            Err(FetchError::Status {
                status: 404,
                message,
                ..
            }) => Ok(repository.gone(404, &message)),
            Err(FetchError::Unauthorized {
                status: 403,
                message,
            }) => Ok(repository.gone(403, &message)),
            other => other,
        }
    }
}

/// `since` as the `since` parameter of an endpoint documented to list what was "updated
/// after" it: a second earlier, in whole seconds, so that a change in the cursor's own
/// second is fetched again (and absorbed by the key) rather than missed.
fn updated_after(since: DateTime<Utc>) -> Option<String> {
    let earlier = DateTime::from_timestamp(since.timestamp().checked_sub(1)?, 0)?;
    Some(earlier.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// One page: its records keyed by `id`, the newest `updated_at`, and the `Link` header's
/// next page. With `stop_before`, the page ends before the first record changed before
/// that second, and nothing after it is asked for.
fn read_page(
    stream: GithubStream,
    stop_before: Option<DateTime<Utc>>,
    answered: &Answered<'_>,
) -> Result<Page, FetchError> {
    let records = adapter::array_records(answered, stream.records())?;
    if let Some(end) = stop_before.and_then(|since| first_older(&records, since)) {
        return Ok(adapter::page_by_id(&records[..end], UPDATED_AT, None));
    }
    // A page whose records can be read but whose Link header cannot is stored, and the
    // run stops after it.
    let (next, stop_after) = match next_page(answered.url, answered.headers) {
        Ok(next) => (next, None),
        Err(message) => (None, Some(message)),
    };
    let mut page = adapter::page_by_id(&records, UPDATED_AT, next);
    page.stop_after = stop_after;
    Ok(page)
}

/// The index of the first record whose `updated_at` lies in a second before `since`'s.
/// Whole seconds, as GitHub writes them: a record of the cursor's own second is kept.
fn first_older(records: &[&RawValue], since: DateTime<Utc>) -> Option<usize> {
    records.iter().position(|record| {
        matches!(UPDATED_AT.in_record(record),
            Some(Watermark::Time(updated)) if updated.timestamp() < since.timestamp())
    })
}

/// The page after this one, from the `Link` header's `rel="next"`; `None` on the last page.
fn next_page(url: &Url, headers: &HeaderMap) -> Result<Option<PagePosition>, String> {
    let links = headers
        .get_all(LINK)
        .iter()
        .map(|value| value.to_str())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "the Link header is not visible ASCII text".to_string())?;
    let Some(target) =
        link::next_target(links).map_err(|message| format!("malformed Link header: {message}"))?
    else {
        return Ok(None);
    };
    let next = url.join(&target).map_err(|err| {
        format!("the Link header's rel=\"next\" target is not a valid URL: {err}")
    })?;
    Ok(Some(PagePosition::Url {
        url: next.to_string(),
    }))
}

/// A repository as a child stream's URLs name it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Repository {
    owner: String,
    name: String,
}

impl Repository {
    /// The repository a stored `repos` record names: its `full_name` ("owner/repo"), else
    /// its `owner.login` and `name`.
    fn of_parent(stream: GithubStream, parent: &ParentRecord<'_>) -> Result<Repository, String> {
        let unusable = |why: &str| {
            format!(
                "the github stream {} cannot list the repository {}: its stored record {why}",
                stream.name(),
                quoted(parent.external_id)
            )
        };
        let payload: Value = serde_json::from_str(parent.payload)
            .map_err(|err| unusable(&format!("is not JSON ({err})")))?;
        let text = |pointer: &str| payload.pointer(pointer).and_then(Value::as_str);
        let from_full_name = text("/full_name").and_then(|full_name| full_name.split_once('/'));
        let from_parts = text("/owner/login").zip(text("/name"));
        let (owner, name) = [from_full_name, from_parts]
            .into_iter()
            .flatten()
            .find(|(owner, name)| is_segment(owner) && is_segment(name))
            .ok_or_else(|| {
                unusable(
                    "has neither a full_name \"owner/repo\" nor an owner.login and a name \
                     that name a repository",
                )
            })?;
        Ok(Repository {
            owner: owner.to_string(),
            name: name.to_string(),
        })
    }

    /// "owner/repo", quoted for messages.
    fn full_name(&self) -> String {
        quoted(&format!("{}/{}", self.owner, self.name))
    }

    /// `{base}/repos/{owner}/{repo}/{tail...}`, each segment percent-encoded.
    fn url(&self, base: &Url, tail: &[&str]) -> Result<Url, FetchError> {
        let mut url = base.clone();
        url.path_segments_mut()
            .map_err(|()| FetchError::InvalidUrl {
                url: crate::http::display_url(base),
                message: "base_url cannot have a path".to_string(),
            })?
            .pop_if_empty()
            .extend(["repos", &self.owner, &self.name])
            .extend(tail);
        Ok(url)
    }

    /// The page saying the repository cannot be listed, and why.
    fn gone(&self, status: u16, message: &str) -> Page {
        let reason = format!(
            "GitHub answered HTTP {status} for the repository {}, which the token can no \
             longer see: {}",
            self.full_name(),
            truncated(message, MAX_QUOTED_CHARS)
        );
        Page {
            parent_gone: Some(reason),
            ..Page::default()
        }
    }
}

/// Whether `text` can be one segment of a repository's path: not empty, no `/`, and not
/// `.` or `..`, which a URL's path would resolve away.
fn is_segment(text: &str) -> bool {
    !text.is_empty() && !text.contains('/') && text != "." && text != ".."
}
