"""Native calls from the main thread run on one long-lived helper thread (one malloc arena for every build and run)."""

import threading

import pytest

from workbench.engines.interruptible import interruptibly, native_work_running, release_freed_memory


def test_successive_calls_share_one_helper_thread_and_hand_back_values_and_errors():
    threads = [interruptibly(threading.current_thread, "run", cancel=lambda: None) for _ in range(3)]
    threads.append(interruptibly(threading.current_thread))  # a build (no cancel) frees memory first, same thread
    assert all(t is threads[0] for t in threads) and threads[0] is not threading.current_thread()
    with pytest.raises(ZeroDivisionError):
        interruptibly(lambda: 1 / 0)
    assert interruptibly(lambda: "after an error") == "after an error"
    assert not native_work_running()


def test_a_busy_helper_does_not_block_the_next_call():
    release = threading.Event()
    started = threading.Event()

    def abandoned():
        started.set()
        release.wait(30)

    from workbench.engines import interruptible as mod

    call = mod._Call(abandoned)  # what an interrupted build leaves running on the helper
    assert mod._HELPER.submit(call)
    started.wait(30)
    try:
        assert native_work_running()
        other = interruptibly(threading.current_thread)  # runs on a fresh thread meanwhile
        assert other is not mod._HELPER.thread and other is not threading.current_thread()
    finally:
        release.set()
        call.done.wait(30)
    assert not native_work_running()
    release_freed_memory()  # a no-op where the C library is not glibc
