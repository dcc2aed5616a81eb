import ArgumentParser
import CofferModel
import CofferSync
import CofferVault
import Foundation

/// `coffer pin` / `coffer unpin` / `coffer on-demand`: which content a device keeps (docs/SYNC.md,
/// "Content on demand").
struct Pin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Keep files and folders' content on this device, for use offline (lists pins without PATH).",
        discussion:
            "A store joined with `coffer account import --on-demand` holds content only once it is read. A pinned "
            + "file or folder has all its content fetched now and by every sync, and never evicted.")
    @OptionGroup var store: StoreOptions
    @Argument(help: "Files or folders to pin.") var paths: [String] = []

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            guard !paths.isEmpty else {
                for id in vault.pinnedIDs { print(vault.path(of: id)) }
                return
            }
            let ids = try paths.map { try vault.resolve($0).id }
            for id in ids { try vault.pin(id) }
            guard vault.serverSettings != nil else { return }
            let engine = try SyncEngine.forStore(vault)
            let bar = SyncProgressBar()
            engine.onProgress { bar.show($0) }
            let fetched = try runBlocking { try await engine.fetchContent(under: ids) }
            bar.finish()
            print("pinned \(ids.count) item\(ids.count == 1 ? "" : "s"); fetched \(fetched) chunks")
        }
    }
}

struct Unpin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stop keeping files and folders' content on this device (it may be evicted once on the server).")
    @OptionGroup var store: StoreOptions
    @Argument(help: "Files or folders to unpin.") var paths: [String]

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            for path in paths { try vault.unpin(try vault.resolve(path).id) }
        }
    }
}

struct OnDemand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "on-demand",
        abstract: "Show or set whether this device keeps content on demand (on) or all of it (off).")
    @OptionGroup var store: StoreOptions
    @Argument(help: "on or off.") var setting: String?

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            switch setting {
            case nil: print(vault.isOnDemand ? "on" : "off")
            case "on"?:
                guard vault.serverSettings != nil else { throw CLIError("content on demand needs a server") }
                try vault.setOnDemand(true)
            case "off"?:
                try vault.setOnDemand(false)
                // Everything this device skipped comes down now: its own tree's here, the shares'
                // with the share feed, read again from the start by this sync.
                guard vault.serverSettings != nil, vault.hasRoot else { return }
                let root = vault.rootID
                try vault.resetFeedCursor()
                let engine = try SyncEngine.forStore(vault)
                let fetched = try runBlocking { try await engine.fetchContent(under: [root]) }
                let report = try runBlocking { try await engine.sync() }
                print("fetched \(fetched + report.fetchedChunks) chunks")
            case let other?:
                throw CLIError("say on or off, not \(other)")
            }
        }
    }
}
