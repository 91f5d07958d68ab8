//! A future that is polled again on the spot when it wakes itself while being polled, instead
//! of going back to the scheduler.
//!
//! Why: a task often wakes itself. A connection's timer waits on a `Notify` that the same
//! task's request handling signals; a call sends its request to a hyper client connection that
//! the same task drives, and the connection hands the answer back through a channel the same
//! task waits on. Tokio treats a task woken while it runs as a task that yielded: it puts it at
//! the back of the run queue and wakes a sleeping worker to come and take it. On a quiet host
//! that is a futex wake and a context switch on another core for nothing, and often the task
//! moving to that core; a gateway call made 3.6 context switches where 2 are needed.
//!
//! [`in_place`] gives the future a waker of its own. A wake while the future is being polled
//! only marks it, and the future is polled again at once; a wake at any other time (the I/O
//! driver, a timer, another task) goes to the task's own waker, as before. The state is one
//! atomic, so a wake from another thread during a poll is never lost: either it sees the poll
//! and marks it (and the poll's end sees the mark), or it sees none and wakes the task.
//! After [`MAX_REPOLLS`] polls in a row, or once the task's cooperative budget is spent, a
//! mark goes to the scheduler after all, so a future that keeps waking itself still yields.
//! (`tokio::task::yield_now` and a tokio resource out of budget defer their wakes until the
//! worker looks for other work, after this poll: those reach the task's own waker.)

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// The future is being polled.
const POLLING: u8 = 1;
/// It was woken during that poll.
const WOKEN: u8 = 2;

/// Polls in a row, in one poll of the task, before a self-wake is handed to the scheduler.
const MAX_REPOLLS: usize = 4;

/// Runs `f`, polling it again on the spot when it wakes itself during a poll: see the module
/// documentation. Wrap a task's whole future (a connection, a call) where its parts wake each
/// other.
///
/// A future of its own, not an `async fn`: an `async fn` keeps its argument in its state and
/// the pinned copy beside it, so a wrapped connection's task took twice its size (17.8 KB
/// instead of 8 per HTTP connection, measured with heaptrack: 10,000 listen streams were
/// 225 MB instead of 130).
pub fn in_place<F: Future>(f: F) -> InPlace<F> {
    let relay = Arc::new(Relay {
        state: AtomicU8::new(0),
        task: AtomicWaker::new(),
    });
    let waker = Waker::from(relay.clone());
    InPlace { f, relay, waker }
}

pin_project_lite::pin_project! {
    /// The future [`in_place`] returns.
    pub struct InPlace<F> {
        #[pin]
        f: F,
        relay: Arc<Relay>,
        waker: Waker,
    }
}

impl<F: Future> Future for InPlace<F> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let (mut f, relay) = (this.f, this.relay);
        relay.task.register(cx.waker());
        let mut inner = Context::from_waker(this.waker);
        for _ in 0..MAX_REPOLLS {
            relay.state.store(POLLING, Ordering::SeqCst);
            if let Poll::Ready(v) = f.as_mut().poll(&mut inner) {
                relay.state.store(0, Ordering::SeqCst);
                return Poll::Ready(v);
            }
            if relay
                .state
                .compare_exchange(POLLING, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Poll::Pending;
            }
            // Woken during the poll: poll again, unless the task's cooperative budget is
            // spent (tokio's own resources would only answer `Pending` again; a yield by
            // hand, as hyper's dispatcher makes every 16 rounds, goes to the scheduler).
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
        }
        // Still waking itself: the scheduler decides when it runs again.
        relay.state.store(0, Ordering::SeqCst);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The waker [`in_place`] polls its future with.
struct Relay {
    state: AtomicU8,
    /// The task's own waker, as of its latest poll.
    task: AtomicWaker,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.load(Ordering::SeqCst);
        loop {
            if state & POLLING == 0 {
                self.task.wake();
                return;
            }
            match self.state.compare_exchange_weak(
                state,
                state | WOKEN,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return,
                Err(now) => state = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Polls `f` once with a counting waker: its result, and how often the task was woken.
    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>, count: &Arc<Count>) -> Poll<F::Output> {
        let waker = Waker::from(count.clone());
        f.poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn the_wrapped_future_is_held_once() {
        // A connection's task holds its whole future: the wrapper must not hold it twice.
        let big = async {
            let buf = [7u8; 4096];
            tokio::task::yield_now().await;
            buf.iter().map(|b| *b as usize).sum::<usize>()
        };
        let inner = std::mem::size_of_val(&big);
        let wrapped = std::mem::size_of_val(&in_place(big));
        assert!(inner >= 4096, "{inner}");
        assert!(wrapped <= inner + 64, "{wrapped} bytes to wrap {inner}");
    }

    #[test]
    fn a_wake_during_the_poll_polls_again_without_waking_the_task() {
        // Ready on its third poll; each earlier poll wakes itself, as a send to a channel
        // the same task reads does.
        let mut polls = 0;
        let f = std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 3 {
                return Poll::Ready(polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        });
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = std::pin::pin!(in_place(f));
        assert_eq!(poll_once(f.as_mut(), &count), Poll::Ready(3));
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "the task was woken");
    }

    #[test]
    fn a_wake_after_the_poll_wakes_the_task() {
        let stored: Arc<std::sync::Mutex<Option<Waker>>> = Arc::default();
        let keep = stored.clone();
        let mut done = false;
        let f = std::future::poll_fn(move |cx| {
            if done {
                return Poll::Ready(());
            }
            done = true;
            *keep.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        });
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = std::pin::pin!(in_place(f));
        assert_eq!(poll_once(f.as_mut(), &count), Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        // From another thread, between polls: the task's own waker.
        let waker = stored.lock().unwrap().take().unwrap();
        std::thread::spawn(move || waker.wake()).join().unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the wake was lost");
        assert_eq!(poll_once(f.as_mut(), &count), Poll::Ready(()));
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields() {
        let mut polls = 0;
        let f = std::future::poll_fn(|cx| {
            polls += 1;
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        });
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = Box::pin(in_place(f));
        assert_eq!(poll_once(f.as_mut(), &count), Poll::Pending);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the task must be woken to run again"
        );
        drop(f);
        assert_eq!(polls, MAX_REPOLLS);
    }

    #[test]
    fn a_wake_from_another_thread_during_the_poll_is_a_poll_again() {
        let mut polls = 0;
        let f = std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 2 {
                return Poll::Ready(());
            }
            // Woken by another thread while this poll runs (joined before it returns).
            let waker = cx.waker().clone();
            std::thread::spawn(move || waker.wake()).join().unwrap();
            Poll::Pending
        });
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = std::pin::pin!(in_place(f));
        assert_eq!(poll_once(f.as_mut(), &count), Poll::Ready(()));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    /// A future that stores its waker in `slot` and is pending until `done` is set.
    fn parked(
        slot: Arc<std::sync::Mutex<Option<Waker>>>,
        done: Arc<std::sync::atomic::AtomicBool>,
    ) -> impl Future<Output = ()> {
        std::future::poll_fn(move |cx| {
            if done.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *slot.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    #[test]
    fn every_wake_between_polls_reaches_the_latest_task_waker() {
        let slot: Arc<std::sync::Mutex<Option<Waker>>> = Arc::default();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut f = Box::pin(in_place(parked(slot.clone(), done.clone())));
        let wake = {
            let slot = slot.clone();
            move || slot.lock().unwrap().clone().unwrap().wake()
        };
        let first = Arc::new(Count(AtomicUsize::new(0)));
        assert_eq!(poll_once(f.as_mut(), &first), Poll::Pending);
        // Two wakes before the task runs: the first takes the task's waker, the second
        // finds none (the task is already woken).
        wake();
        wake();
        assert_eq!(first.0.load(Ordering::SeqCst), 1);
        // Polled again, under another waker (a task may be polled with a new one): the
        // next wake goes to that one alone.
        let second = Arc::new(Count(AtomicUsize::new(0)));
        assert_eq!(poll_once(f.as_mut(), &second), Poll::Pending);
        std::thread::spawn(wake.clone()).join().unwrap();
        assert_eq!(first.0.load(Ordering::SeqCst), 1);
        assert_eq!(second.0.load(Ordering::SeqCst), 1, "the wake was lost");
        done.store(true, Ordering::SeqCst);
        assert_eq!(poll_once(f.as_mut(), &second), Poll::Ready(()));
    }

    #[tokio::test]
    async fn a_yield_by_hand_with_the_budget_spent_goes_to_the_scheduler() {
        // Spends the task's whole budget, then yields as hyper's dispatcher does: wakes
        // itself and is pending. Polled again on the spot, it would find the budget spent
        // and could only be pending again (a tokio resource defers its wake then).
        let wasted = Arc::new(AtomicUsize::new(0));
        let counted = wasted.clone();
        let mut spent = false;
        let f = std::future::poll_fn(move |cx| {
            if !tokio::task::coop::has_budget_remaining() {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut one = std::pin::pin!(tokio::task::consume_budget());
                return one.as_mut().poll(cx);
            }
            if spent {
                return Poll::Ready(());
            }
            while tokio::task::coop::has_budget_remaining() {
                let mut one = std::pin::pin!(tokio::task::consume_budget());
                let _ = one.as_mut().poll(cx);
            }
            spent = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        });
        tokio::spawn(in_place(f)).await.unwrap();
        assert_eq!(
            wasted.load(Ordering::SeqCst),
            0,
            "polled again with the budget spent"
        );
    }

    #[test]
    fn a_wake_racing_the_end_of_a_poll_never_silences_later_wakes() {
        // Another thread wakes the future without pause while it is polled over and over.
        // Each poll must leave the task woken: a wake that marked a poll after its end would
        // leave every later wake marked, and lost.
        let slot: Arc<std::sync::Mutex<Option<Waker>>> = Arc::default();
        let keep = slot.clone();
        let f = std::future::poll_fn(move |cx| {
            keep.lock()
                .unwrap()
                .get_or_insert_with(|| cx.waker().clone());
            for _ in 0..10 {
                std::hint::spin_loop();
            }
            Poll::<()>::Pending
        });
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let mut f = Box::pin(in_place(f));
        assert_eq!(poll_once(f.as_mut(), &count), Poll::Pending);
        let inner = slot.lock().unwrap().clone().unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    inner.wake_by_ref();
                }
            })
        };
        for round in 0..20_000 {
            // The poll registers the task's waker again: from then on, a wake must reach it
            // (during the poll, as the poll's last act, or after).
            let began = count.0.load(Ordering::SeqCst);
            assert_eq!(poll_once(f.as_mut(), &count), Poll::Pending);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while count.0.load(Ordering::SeqCst) == began {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: no wake reached the task after the poll"
                );
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::SeqCst);
        waker.join().unwrap();
    }
}
