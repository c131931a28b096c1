# ringx_bool_choice(<var> <word>...): <var> may hold one of the words (auto) or
# any CMake boolean in any case (ON/OFF, TRUE/FALSE, YES/NO, Y/N, 1/0), as CMake
# users write them (-C cmake.define.RINGX_CUDA=ON). Sets <var> in the caller's
# scope to the word, `on` or `off`, or stops the configure naming what it takes.
function(ringx_bool_choice var)
  string(TOLOWER "${${var}}" value)
  list(FIND ARGN "${value}" word)
  if(word GREATER -1)
    set(choice "${value}")
  elseif(value MATCHES "^(1|on|yes|true|y)$")
    set(choice on)
  elseif(value MATCHES "^(0|off|no|false|n)$")
    set(choice off)
  else()
    list(JOIN ARGN ", " words)
    message(FATAL_ERROR
      "${var} must be ${words}, on or off (or any CMake boolean: ON/OFF, TRUE/FALSE, YES/NO, 1/0), not '${${var}}'")
  endif()
  set(${var} "${choice}" PARENT_SCOPE)
endfunction()
