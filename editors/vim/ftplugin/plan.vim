" Vim filetype plugin for planlang (*.plan): comments, indentation width, matching brackets.
" License: Apache-2.0 (SPDX-License-Identifier: Apache-2.0), as the rest of planlang.
if exists('b:did_ftplugin')
  finish
endif
let b:did_ftplugin = 1

setlocal commentstring=#\ %s
setlocal comments=:#
setlocal formatoptions-=t formatoptions+=croql
setlocal expandtab shiftwidth=4 softtabstop=4
setlocal iskeyword=@,48-57,_
setlocal matchpairs=(:),[:],{:}
setlocal suffixesadd=.plan

let b:undo_ftplugin = 'setlocal commentstring< comments< formatoptions< expandtab< shiftwidth<'
      \ . ' softtabstop< iskeyword< matchpairs< suffixesadd<'
