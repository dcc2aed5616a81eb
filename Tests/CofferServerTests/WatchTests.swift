import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import CofferServerHTTP
import Foundation
import Hummingbird
import HummingbirdTesting
import Testing

/// The live channel's server side (docs/SYNC.md, "Live"): `POST /v1/watch` and `ChangeNotifier`.
@Suite struct WatchTests {
    /// Waits (up to 10 s) until the server holds `count` watches.
    func untilWatching(_ server: CofferServer, _ count: Int) async throws {
        for _ in 0..<1000 where server.notifier.registered < count { try await Task.sleep(for: .milliseconds(10)) }
        #expect(server.notifier.registered == count)
    }

    @Test func aNotificationBeforeTheWaitIsNotLost() async {
        let notifier = ChangeNotifier()
        let account = Data([1, 2, 3])
        guard let ticket = notifier.register(account) else {
            Issue.record("no ticket")
            return
        }
        notifier.notify([account])
        let start = ContinuousClock.now
        await notifier.wait(ticket, timeout: .seconds(30))
        #expect(ContinuousClock.now - start < .seconds(10))
        #expect(notifier.registered == 0)
    }

    @Test func waitsEndAfterTheirTimeoutAndAtShutdown() async {
        let notifier = ChangeNotifier(maxPerAccount: 2)
        let account = Data([7])
        let other = Data([8])
        guard let a = notifier.register(account), let b = notifier.register(account) else {
            Issue.record("no ticket")
            return
        }
        // Past the per-account cap: refused, while another account still may watch.
        #expect(notifier.register(account) == nil)
        guard let c = notifier.register(other) else {
            Issue.record("no ticket")
            return
        }
        // A change to another account wakes nothing here.
        notifier.notify([other])
        let start = ContinuousClock.now
        await notifier.wait(a, timeout: .milliseconds(200))
        #expect(ContinuousClock.now - start >= .milliseconds(150))
        await notifier.wait(c, timeout: .seconds(30))
        // Only shutdown can end this wait well before its timeout (a busy test run may starve
        // this task for a while, hence the margins).
        async let waiting: Void = notifier.wait(b, timeout: .seconds(300))
        for _ in 0..<5 { try? await Task.sleep(for: .milliseconds(10)) }
        notifier.shutdown()
        await waiting
        #expect(ContinuousClock.now - start < .seconds(250))
        #expect(notifier.registered == 0)
        #expect(notifier.register(account) == nil)
    }

    @Test func aWatchIsAnsweredWhenTheTreeOrAShareChanges() async throws {
        let (app, server) = try makeApp()
        let alice = try Device(server, TestUser("alice"))
        let bob = TestUser("bob")
        try await app.test(.router) { client in
            #expect(try await client.signedJSON(bob, .post, "/v1/accounts", bob.createRequest).status == .ok)
            let root = rootRecord(alice.user)
            var shared = record(alice.user, .folder, in: root.id, named: "shared")
            shared.access = [try signedGrant(shared.id, owner: alice.user, to: bob, .write)]
            let v1 = try alice.push([root, shared])

            // Behind the server: answered at once.
            let behind = try await client.signedJSON(alice.user, .post, "/v1/watch", WatchRequest(since: 0))
            let state = try behind.json(WatchResponse.self)
            #expect(behind.status == .ok && state.changed && state.latest == v1)

            // Up to date: held until the tree changes.
            async let held = client.signedJSON(
                alice.user, .post, "/v1/watch", WatchRequest(since: v1, feedSince: 0, contactsRevision: 0))
            try await untilWatching(server, 1)
            let note = record(alice.user, .document, in: shared.id, named: "note")
            let v2 = try alice.push([note])
            let woken = try await held.json(WatchResponse.self)
            #expect(woken.changed && woken.latest == v2)

            // The grantee is woken by a change in the folder shared with it (its feed).
            let bobState = try await client.signedJSON(bob, .post, "/v1/watch", WatchRequest(since: 0, feedSince: 0))
                .json(WatchResponse.self)
            #expect(bobState.changed && bobState.feedLatest > 0)
            async let bobHeld = client.signedJSON(
                bob, .post, "/v1/watch",
                WatchRequest(since: bobState.latest, feedSince: bobState.feedLatest, contactsRevision: 0))
            try await untilWatching(server, 1)
            _ = try alice.push([record(alice.user, .document, in: shared.id, named: "another")])
            let bobWoken = try await bobHeld.json(WatchResponse.self)
            #expect(bobWoken.changed && bobWoken.feedLatest > bobState.feedLatest)

            // Nothing changes: answered unchanged after the wait it asked for.
            let quiet = try await client.signedJSON(
                alice.user, .post, "/v1/watch",
                WatchRequest(since: Int64.max / 2, feedSince: Int64.max / 2, contactsRevision: 0, wait: 1))
            #expect(try quiet.json(WatchResponse.self).changed == false)
            #expect(server.notifier.registered == 0)

            // Hostile cursors are refused.
            let negative = try await client.signedJSON(alice.user, .post, "/v1/watch", WatchRequest(since: -1))
            #expect(negative.status == .badRequest)
        }
    }
}
