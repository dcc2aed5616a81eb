import CofferTestSupport
import Foundation
import Testing

/// The live channel end to end (docs/SYNC.md, "Live"): real `coffer-server`, real mounts on
/// default settings but for a poll too slow to carry anything here.
@Suite(.serialized) struct LiveSyncTests {
    func text(_ path: String) -> String? { readFile(path).map { String(decoding: $0, as: UTF8.self) } }

    /// Voluntary context switches of every thread of `pid` so far: each is one wakeup.
    func wakeups(_ pid: pid_t) -> Int {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.reduce(0) { sum, tid in
            let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("voluntary_ctxt_switches:") }
            return sum + (line.flatMap { Int($0.split(separator: "\t").last ?? "") } ?? 0)
        }
    }

    @Test func changesArriveThroughTheServersWordAndAnIdleMountSleeps() throws {
        let tmp = TemporaryDirectory("coffer-live")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        // An hour between polls: whatever arrives below came through the live channel.
        let slowPoll = ["--sync-interval", "3600"]
        let a = try MountFixture(
            "coffer-live-a", initArguments: ["init", "alice", "--server", server.url], mountArguments: slowPoll)
        let key = coffer(a.dataDir, ["account", "export"]).stdout
        let b = try MountFixture(
            "coffer-live-b", initArguments: ["account", "import", "--server", server.url], initInput: key,
            mountArguments: slowPoll)
        #expect(
            eventually(timeout: 20) { coffer(b.dataDir, ["status"]).out.contains("live channel: live") },
            "B's channel never came up: \(coffer(b.dataDir, ["status"]).out)\n\(b.log)")

        // The same for scripts.
        let json = coffer(b.dataDir, ["status", "--json"])
        let status = try #require(
            try JSONSerialization.jsonObject(with: Data(json.stdout)) as? [String: Any], "\(json.out)")
        #expect((status["live"] as? [String: Any])?["state"] as? String == "live")
        #expect((status["mounted"] as? [String: Any])?["mountPoint"] as? String == b.mountPoint)
        #expect((status["sync"] as? [String: Any])?["server"] as? String == server.url)
        #expect((status["pending"] as? [String: Any])?["created"] as? Int == 0)

        // Written and closed in A, readable in B: A pushes on the close, the server tells B.
        for i in 0..<3 {
            #expect(writeFile(a.path("note-\(i).txt"), "note \(i)\n") == 0)
            #expect(
                eventually(timeout: 15) { text(b.path("note-\(i).txt")) == "note \(i)\n" },
                "note \(i) not in B; A log: \(a.log)\nB log: \(b.log)")
        }
        // And back, a rename and a deletion included.
        #expect(rename(b.path("note-0.txt"), b.path("renamed.txt")) == 0)
        #expect(unlink(b.path("note-1.txt")) == 0)
        #expect(
            eventually(timeout: 15) {
                text(a.path("renamed.txt")) == "note 0\n" && text(a.path("note-1.txt")) == nil
                    && text(a.path("note-0.txt")) == nil
            }, "B's changes not in A; A log: \(a.log)")

        // A burst: files committed while a sync runs go up with the next one, not with the
        // five-minute poll.
        try FileManager.default.createDirectory(atPath: a.path("burst"), withIntermediateDirectories: true)
        for i in 0..<300 { #expect(writeFile(a.path("burst/f\(i).txt"), "burst \(i)\n") == 0) }
        #expect(
            eventually(timeout: 60) {
                text(b.path("burst/f299.txt")) == "burst 299\n" && text(b.path("burst/f0.txt")) != nil
            },
            "the burst did not arrive; A log: \(a.log)")
        #expect(coffer(a.dataDir, ["status"]).out.contains("pending:  0 created, 0 modified, 0 deleted"))

        // Idle, a mount wakes next to never: no thread polls the store, the server or the
        // kernel. (Before the live channel: the sync scheduler 10 times a second, the change
        // watcher 5, the commit thread 80, the FUSE workers 2, a request's watchdog 4.)
        guard let pid = a.daemonPID else {
            Issue.record("no daemon for A")
            return
        }
        Thread.sleep(forTimeInterval: 2)
        let before = wakeups(pid)
        Thread.sleep(forTimeInterval: 5)
        let woken = wakeups(pid) - before
        #expect(woken < 25, "the idle daemon woke \(woken) times in 5 s")

        // The server goes away: the channel says so, and comes back with it.
        server.stop()
        #expect(
            eventually(timeout: 20) { coffer(a.dataDir, ["status"]).out.contains("live channel: down") },
            "status: \(coffer(a.dataDir, ["status"]).out)")
        #expect(writeFile(a.path("while-down.txt"), "offline\n") == 0)
        #expect(
            eventually(timeout: 10) {
                let r = coffer(a.dataDir, ["status", "--json"])
                let pending = (try? JSONSerialization.jsonObject(with: Data(r.stdout)) as? [String: Any])?["pending"]
                return ((pending as? [String: Any])?["bytesUp"] as? Int ?? 0) > 0
            }, "the file written while down is not counted as waiting to go up")
        try server.start()
        #expect(
            eventually(timeout: 60) { text(b.path("while-down.txt")) == "offline\n" },
            "the change made while the server was down did not arrive; A log: \(a.log)\nB log: \(b.log)")
        #expect(coffer(b.dataDir, ["status"]).out.contains("live channel: live"))
    }
}
