import Foundation

@testable import CofferVault

/// A fresh vault in a temporary folder, removed with the last reference: what the tests that
/// call `CofferFileSystem` directly start from.
final class TemporaryVault {
    let dir: String
    let vault: Vault

    init(_ label: String) throws {
        dir = NSTemporaryDirectory() + "coffer-\(label)-" + UUID().uuidString
        vault = try Vault.create(dataDirectory: dir + "/data", username: "rita")
    }

    deinit { try? FileManager.default.removeItem(atPath: dir) }
}
