// Every RINGX_* environment setting, in one table, read through one accessor.
//
// The table feeds the code (typed reads with clear errors), `python -m ringx`
// (effective values next to defaults) and the README's knob table (made from
// it by `python -m ringx --markdown-settings`). Values are read from the
// environment each time they are asked for; whoever needs one on a hot path
// reads it once when its object is built (a process group reads its settings
// at creation) and keeps it there.
//
// Settings that shape a schedule (slot size, algorithm override, chunk size,
// shared memory on or off) must be the same on every rank of a group:
// checkSettingsAgree compares them through the store when a group is built.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/store.h"

namespace ringx {

enum class SettingType {
  Text,         // free text, e.g. a list
  Choice,       // one of a few words (case-insensitive)
  Flag,         // 0 or 1
  PositiveInt,  // an integer > 0 (bytes, microseconds)
};

struct Setting {
  const char* name;
  SettingType type;
  const char* values;          // what may be given, for people (README, python -m ringx)
  const char* defaultValue;    // the value when unset; "" when there is none or it is computed
  const char* defaultText;     // the default, for people
  size_t (*computeDefault)();  // a PositiveInt default that depends on the host, or nullptr
  bool ranksMustAgree;
  const char* help;
};

const std::vector<Setting>& settingsTable();
// The row of `name`; throws std::logic_error for a name not in the table.
const Setting& settingSpec(std::string_view name);

// The one accessor: the environment's value of `name`, or nullopt when it is
// unset or empty.
std::optional<std::string> settingValue(std::string_view name);

// Typed reads. Throw Error(InvalidArgument) naming the variable and its value
// when the value is not of the setting's type.
std::string settingText(std::string_view name);
size_t settingPositive(std::string_view name);
bool settingFlag(std::string_view name);

// The value in effect, as text: the environment's (normalised) or the default.
// Host-computed defaults are resolved. Throws like the typed reads.
std::string settingEffective(std::string_view name);

// This process's ranksMustAgree settings, encoded for checkSettingsAgree.
std::string agreementRecord();

// Collective over the ranks of a group: publishes this rank's record of its
// ranksMustAgree settings under keyPrefix, rank 0 reads every rank's and
// publishes its verdict, and every rank throws
// Error(InvalidArgument) naming the first setting the ranks disagree on, each
// value and the ranks that have it. An unset setting is compared as "unset",
// not as its default, so a host-computed default never makes ranks on
// different hosts disagree.
void checkSettingsAgree(Store& store, const std::string& keyPrefix, int rank, int size,
                        const std::string& record = agreementRecord());

}  // namespace ringx
